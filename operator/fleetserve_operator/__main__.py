"""`fleetserve-operator run` / `python -m fleetserve_operator run`: start the operator.

Loads `OperatorConfig` from `FLEETSERVE_*` (a bad value stops start-up, naming the variable),
serves the operator's metrics, registers the handlers in an explicit kopf registry and runs
kopf's operator with the configured namespaces and liveness endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import kopf
from prometheus_client import start_http_server
from pydantic import ValidationError

from fleetserve_operator import handlers
from fleetserve_operator.kube import KubeApi
from fleetserve_operator.metrics import OperatorMetrics
from fleetserve_operator.settings import OperatorConfig, apply_kopf_settings
from fleetserve_operator.sync import Sync

__all__ = ["main"]


def _run(config: OperatorConfig) -> None:
    kopf.configure(verbose=config.verbose, log_format=kopf.LogFormat[config.log_format.upper()])
    metrics = OperatorMetrics()
    if config.metrics_port:
        start_http_server(
            config.metrics_port, addr=config.listen_address, registry=metrics.registry
        )
    kube = KubeApi.from_environment(timeout_s=config.request_timeout_s)
    allowlist = config.prometheus_allowlist
    sync = Sync(
        kube,
        metrics=metrics,
        default_prometheus_url=config.prometheus_url,
        prometheus_allowlist=allowlist,
        metric_source=allowlist.source,
    )
    registry = kopf.OperatorRegistry()
    handlers.register(
        registry,
        sync,
        resync_interval_s=config.resync_interval_s,
        rollout_tick_s=config.rollout_tick_s,
        retry_delay_s=config.retry_delay_s,
    )
    settings = kopf.OperatorSettings()
    apply_kopf_settings(settings, config)
    liveness = (
        f"http://{config.listen_address}:{config.liveness_port}/healthz"
        if config.liveness_port
        else None
    )
    asyncio.run(
        kopf.operator(
            registry=registry,
            settings=settings,
            standalone=True,
            clusterwide=config.is_clusterwide,
            namespaces=config.namespaces,
            liveness_endpoint=liveness,
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `fleetserve-operator`; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="fleetserve-operator",
        description="Run the Fleetserve operator; settings come from FLEETSERVE_* variables.",
    )
    parser.add_argument("command", choices=["run"], nargs="?", default="run")
    parser.parse_args(argv)
    try:
        config = OperatorConfig()
    except ValidationError as exc:
        print(f"fleetserve-operator: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    _run(config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
