"""Publish where each pod process listens: a JSON map and a Prometheus file_sd file.

The e2e load driver and tests read the map (``pods.json``) to reach a pod, as a Service would
route to it in a cluster; Prometheus reads the file_sd file (``file_sd.json``) and scrapes every
pod process with the labels a PodMonitor would attach.  Files are replaced atomically (write,
then rename) so readers never see half a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TRACK_LABEL = "serving.fleetserve.io/track"
VERSION_LABEL = "serving.fleetserve.io/model-version"
INSTANCE_LABEL = "app.kubernetes.io/instance"
POD_MAP_FILE = "pods.json"
FILE_SD_FILE = "file_sd.json"


@dataclass(frozen=True)
class PodAddress:
    """One pod process: who it is, where it listens (``<pod IP>:<port>``) and its pid.

    The pod IP is 127.0.0.1, or the pod's own loopback address in a cluster with a pod network.
    """

    namespace: str
    pod: str
    address: str
    ready: bool
    pid: int
    labels: dict[str, str] = field(default_factory=dict)
    grpc_address: str | None = None
    """``<pod IP>:<port>`` of the runtime's gRPC listener; None when the pod has none."""

    @property
    def url(self) -> str:
        """The pod's base URL."""
        return f"http://{self.address}"


def _write_json_atomically(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)


def write_pod_map(path: Path, pods: Iterable[PodAddress]) -> None:
    """Write the pod map: a JSON list of :class:`PodAddress` records."""
    _write_json_atomically(path, [asdict(pod) for pod in pods])


def read_pod_map(path: Path) -> list[PodAddress]:
    """Read a pod map written by :func:`write_pod_map` (missing file: no pods yet)."""
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    return [PodAddress(**record) for record in records]


def scrape_labels(pod: PodAddress) -> dict[str, str]:
    """Return the target labels Prometheus attaches to a pod's samples."""
    labels = {"namespace": pod.namespace, "pod": pod.pod}
    for target, source in (
        ("track", TRACK_LABEL),
        ("model_version", VERSION_LABEL),
        ("app_instance", INSTANCE_LABEL),
    ):
        if source in pod.labels:
            labels[target] = pod.labels[source]
    return labels


def write_file_sd(path: Path, pods: Iterable[PodAddress]) -> None:
    """Write a Prometheus ``file_sd_configs`` file with one target group per pod."""
    _write_json_atomically(
        path, [{"targets": [pod.address], "labels": scrape_labels(pod)} for pod in pods]
    )
