"""A real Prometheus (Debian's ``prometheus`` package) scraping the pod processes.

It is started on a free loopback port with a generated config whose only scrape job reads the
harness's file_sd file, so Prometheus discovers pod processes as they come and go, much as
Kubernetes pod discovery would.  ``honor_labels`` is false, as in the chart's PodMonitor: a
discovered target label (``namespace``, ``pod``, ``track``) wins over a label of that name in
the scraped series, which Prometheus keeps as ``exported_<name>``, so the rollout analysis
selects by the namespace Prometheus discovered, never one a pod claims. The runtime's
``track`` label equals its pod's, and its ``model``/``version`` labels have no target label
of that name, so they are stored as the runtime exports them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx

from fleetserve_e2e.lifecycle import Component, WorkDir
from fleetserve_e2e.ports import free_port
from fleetserve_e2e.processes import MARKER_ENV, ManagedProcess, start_process
from fleetserve_e2e.waiting import wait_until

JOB = "fleetserve-pods"
_START_TIMEOUT_S = 30.0


def prometheus_config(file_sd_path: Path, scrape_interval_s: float) -> dict[str, Any]:
    """Return the Prometheus config (JSON is valid YAML, so it is written as JSON)."""
    interval = f"{int(scrape_interval_s * 1000)}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": JOB,
                "honor_labels": False,
                # Short timeouts fit the interval and a loopback target.
                "scrape_timeout": interval,
                "file_sd_configs": [{"files": [str(file_sd_path)], "refresh_interval": "1s"}],
            }
        ],
    }


class LocalPrometheus(Component):
    """Context manager running Prometheus against a file_sd file.

    Args:
        file_sd_path: The file the pod runner keeps up to date.
        scrape_interval_s: Scrape and evaluation interval, in seconds.
        work_dir: Where config and TSDB go; a temp dir removed on exit when None.
        binary: The ``prometheus`` executable.
    """

    def __init__(
        self,
        file_sd_path: Path,
        *,
        scrape_interval_s: float = 1.0,
        work_dir: Path | None = None,
        binary: str = "prometheus",
    ) -> None:
        """Configure; nothing starts before ``__enter__``."""
        self.file_sd_path = file_sd_path
        self.scrape_interval_s = scrape_interval_s
        self._work_dir = WorkDir(work_dir, prefix="fleetserve-prometheus-")
        self._binary = binary
        self.port = 0
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """Base URL of the HTTP API, e.g. ``http://127.0.0.1:41234``."""
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        """Write the config, start Prometheus and wait until it is ready."""
        executable = shutil.which(self._binary)
        if executable is None:
            raise FileNotFoundError(
                f"{self._binary} not found; install Debian's package: apt-get install prometheus"
            )
        work_dir = self._work_dir.make()
        config_path = work_dir / "prometheus.yml"
        config = prometheus_config(self.file_sd_path, self.scrape_interval_s)
        config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
        self.port = free_port()
        self.process = start_process(
            "prometheus",
            [
                executable,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            log_path=work_dir / "prometheus.log",
            env={**os.environ, MARKER_ENV: str(work_dir)},
        )
        wait_until(self._is_ready, timeout_s=_START_TIMEOUT_S, what="Prometheus /-/ready")

    def close(self) -> None:
        """Stop the process and remove an owned work dir (idempotent)."""
        if self.process is not None:
            self.process.stop()
        self._work_dir.remove()

    def _is_ready(self) -> bool:
        if self.process is not None:
            self.process.ensure_running()
        return httpx.get(f"{self.url}/-/ready", timeout=1.0, trust_env=False).is_success

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Run an instant query and return ``data.result``."""
        response = httpx.get(
            f"{self.url}/api/v1/query", params={"query": promql}, timeout=5.0, trust_env=False
        )
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        """Return the active scrape targets with their health (``up``/``down``/``unknown``)."""
        response = httpx.get(f"{self.url}/api/v1/targets", timeout=5.0, trust_env=False)
        response.raise_for_status()
        targets: list[dict[str, Any]] = response.json()["data"]["activeTargets"]
        return targets
