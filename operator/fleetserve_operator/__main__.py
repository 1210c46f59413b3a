"""`fleetserve-operator run` / `python -m fleetserve_operator run`: start the operator.

Loads `OperatorConfig` from `FLEETSERVE_*` (a bad value stops start-up, naming the variable),
serves the operator's metrics, waits for the leader Lease (`leader`; a standby answers
`/healthz` meanwhile), registers the watches (the children's keep what they see in a
`ChildCache`, the InferenceServices' in a `ServiceCache`, both read by the reconciles), their
work queue's workers and the resync lane (started and stopped with kopf) in an explicit
kopf registry and runs kopf's operator with the configured namespaces and liveness
endpoint. Events are posted by a thread of their own (`EventPoster`).
The leader renews the Lease from a thread and exits at once (status 1) if it loses it; on a
clean stop (SIGTERM) it releases the Lease after kopf has stopped, so a standby takes over
without waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import sys
from collections.abc import Sequence
from contextlib import nullcontext

import kopf
from prometheus_client import start_http_server
from pydantic import ValidationError

from fleetserve_operator import observe
from fleetserve_operator.controller import handlers
from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.controller.cached_kube import CachedKube
from fleetserve_operator.controller.child_watch import CHILD_KINDS, ChildWatches
from fleetserve_operator.controller.events import EventPoster
from fleetserve_operator.controller.kube import Cluster, KubeApi
from fleetserve_operator.controller.leader import (
    KubeLeases,
    LeaderElector,
    StandbyProbe,
    candidate_identity,
)
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.controller.service_watch import ServiceSink
from fleetserve_operator.controller.settings import OperatorConfig, apply_kopf_settings
from fleetserve_operator.controller.sync import Sync

__all__ = ["main"]

logger = logging.getLogger(__name__)
_EVENTS_WAITING = 10_000
"""Events queued for posting before new ones are dropped: ten per service of a large fleet."""


def _exit_on_lost(reason: str) -> None:
    """Stop reconciling at once: a leader without the lease must not write another object."""
    logger.critical("Lost the leader lease (%s); exiting so that Kubernetes restarts me", reason)
    logging.shutdown()
    os._exit(1)


def _lead(config: OperatorConfig, metrics: OperatorMetrics, kube: KubeApi) -> LeaderElector:
    """Block until this replica holds the leader Lease, then keep renewing it."""
    elector = LeaderElector(
        KubeLeases.over(
            kube.api_client, config.leader_election_namespace, config.leader_election_lease
        ),
        identity=candidate_identity(config.pod_name),
        timing=config.lease_timing,
        registry=metrics.registry,
    )
    probe = (
        StandbyProbe(config.listen_address, config.liveness_port)
        if config.liveness_port
        else nullcontext()
    )
    with probe:
        elector.acquire()
    elector.start_renewing(on_lost=_exit_on_lost)
    return elector


def _run(config: OperatorConfig) -> None:
    kopf.configure(verbose=config.verbose, log_format=kopf.LogFormat[config.log_format.upper()])
    metrics = OperatorMetrics()
    if config.metrics_port:
        start_http_server(
            config.metrics_port, addr=config.listen_address, registry=metrics.registry
        )
    kube = KubeApi.from_environment(
        timeout_s=config.request_timeout_s, connections=_connections(config)
    )
    elector = _lead(config, metrics, kube) if config.leader_election else None
    try:
        _operate(config, metrics, kube)
    finally:
        if elector is not None:
            elector.release()


def _connections(config: OperatorConfig) -> int:
    """Threads that may wait on the API server at once: every watch and every worker.

    Plus the reconciles' write threads, the resync lane, the Event poster and the Lease's
    renewals.
    """
    watches = len(CHILD_KINDS) * max(1, len(config.namespaces))
    return watches + config.queue_workers + _write_threads(config) + config.workers + 3


def _write_threads(config: OperatorConfig) -> int:
    """One per queue worker: each reconcile may make its independent writes at once."""
    return config.queue_workers


def _reconciler(config: OperatorConfig, metrics: OperatorMetrics, kube: Cluster) -> Sync:
    """The reconcile every handler runs, with the operator-wide settings of `config`."""
    allowlist = config.prometheus_allowlist
    return Sync(
        kube,
        metrics=metrics,
        default_prometheus_url=config.prometheus_url,
        prometheus_allowlist=allowlist,
        webhook_allowlist=config.webhook_allowlist,
        metric_source=allowlist.source,
        images=config.runtime_images,
        write_threads=_write_threads(config),
    )


def _operate(config: OperatorConfig, metrics: OperatorMetrics, kube: KubeApi) -> None:
    cache, services = ChildCache(), ServiceCache()
    events = EventPoster(kube.post_event, capacity=_EVENTS_WAITING)
    try:
        _serve(config, metrics, kube, CachedKube(kube, cache, events, services), cache, services)
    finally:
        events.close(timeout_s=config.request_timeout_s)


def _is_ticking(services: ServiceCache, key: tuple[str, str]) -> bool:
    """Whether the service's last known status asks for the rollout tick."""
    status = services.status(*key)
    return status is not None and handlers.is_ticking(status)


def _queue_and_watches(
    config: OperatorConfig,
    metrics: OperatorMetrics,
    sync: Sync,
    kube: KubeApi,
    caches: tuple[ChildCache, ServiceCache],
) -> tuple[handlers.QueueWorkers, ChildWatches]:
    """The work queue's workers and the watches that fill it and the `caches`.

    A child's event queues its owner in the event lane; a listing (at start, and after a
    410 or a failure) names every service, and queues them in the rate-limited resync lane,
    where a new leader's resumes also go: the first lists would otherwise hold every worker
    while a user's change waits. A service's new generation goes in the change lane.
    """
    cache, services = caches
    workers = handlers.QueueWorkers(
        sync,
        metrics,
        workers=config.queue_workers,
        event_delay_s=config.child_event_delay_s,
        requeue=handlers.Requeue(
            retry_delay_s=config.retry_delay_s,
            tick_s=config.rollout_tick_s,
            ticking=functools.partial(_is_ticking, services),
        ),
    )
    watches = ChildWatches(
        kube.api_client,
        namespaces=config.namespaces,
        readings=observe.STATUS_READINGS,
        on_owner=workers.add,
        on_listed=workers.resync,
        watch_timeout_s=config.watch_timeout_s,
        request_timeout_s=config.request_timeout_s,
        cache=cache,
        services=functools.partial(ServiceSink, services, workers),
    )
    return workers, watches


def _serve(
    config: OperatorConfig,
    metrics: OperatorMetrics,
    kube: KubeApi,
    cached: CachedKube,
    cache: ChildCache,
    services: ServiceCache,
) -> None:
    """Run kopf with the work queue, the resync lane and the watches filling the caches.

    The child watches fill `cache`, the InferenceServices' watch fills `services`.
    """
    sync = _reconciler(config, metrics, cached)
    workers, watches = _queue_and_watches(config, metrics, sync, kube, (cache, services))
    resyncer = handlers.Resyncer(
        sync, services, interval_s=config.resync_interval_s, enqueue=workers.resync
    )
    registry = kopf.OperatorRegistry()
    handlers.register(registry, sync, resyncer, children=(workers, watches))
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
    parser.add_argument(
        "--leader-election",
        choices=["true", "false"],
        help="Wait for the leader Lease before reconciling (default: FLEETSERVE_LEADER_ELECTION, "
        "true); false for a single replica or a local run.",
    )
    args = parser.parse_args(argv)
    try:
        config = OperatorConfig()
    except ValidationError as exc:
        print(f"fleetserve-operator: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    if args.leader_election is not None:
        config = config.model_copy(update={"leader_election": args.leader_election == "true"})
    _run(config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
