"""Helpers of the operator e2e tests: run the real operator, build and read InferenceServices.

`conftest.py` starts `fleetserve-operator run` through `OperatorProcess` (a subprocess with a
kubeconfig of its own, watching one namespace) and the tests read objects, statuses and the
operator's own metrics through the functions here. Every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_e2e import KubeApiError, KubeClient
from fleetserve_e2e.kubeapi import JsonObject, namespaced
from fleetserve_e2e.ports import free_port
from fleetserve_e2e.processes import MARKER_ENV, ManagedProcess, start_process
from fleetserve_e2e.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / ".venv" / "bin" / "fleetserve-operator"
# The documented names (ARCHITECTURE.md, "Names"), spelled out: these tests treat the operator
# as a black box, and importing its package here would also need the stdlib `operator`, which
# pytest shadows with this folder (see conftest.py).
GROUP_VERSION = "serving.fleetserve.io/v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
INSTANCE_LABEL = "app.kubernetes.io/instance"
TRACK_LABEL = "serving.fleetserve.io/track"
MODEL_VERSION_LABEL = "serving.fleetserve.io/model-version"
POOL_LABEL = "serving.fleetserve.io/pool"
MANAGER = "fleetserve-operator"
# Where each kind of child lives in the API (group/version, plural).
CHILD_APIS = {
    "Deployment": ("apps/v1", "deployments"),
    "Service": ("", "services"),
    "HTTPRoute": ("gateway.networking.k8s.io/v1", "httproutes"),
}
# Variables the operator must not inherit from the test's environment: its settings come only
# from what the test sets, and loopback API traffic must never go through a proxy.
_SCRUBBED = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "KUBERNETES_SERVICE_HOST")


def fsvc_path(namespace: str, name: str = "") -> str:
    """REST path of the InferenceServices of `namespace` (or of one of them)."""
    return namespaced(PLURAL, namespace, name, group_version=GROUP_VERSION)


def child_path(kind: str, namespace: str, name: str = "") -> str:
    """REST path of a child kind in `namespace` (or of one object)."""
    group_version, plural = CHILD_APIS[kind]
    return namespaced(plural, namespace, name, group_version=group_version)


def synthetic_service(name: str, **sections: Any) -> JsonObject:
    """A small InferenceService: one CPU replica of the synthetic model; `sections` override."""
    spec: JsonObject = {
        "model": {"name": name, "version": "1", "uri": "builtin://synthetic?latency_ms=1"},
        "runtime": {"replicas": {"min": 1, "max": 1}, "device": "cpu", "threads": 1},
        "batching": {"maxBatchSize": 4, "maxQueueDelayMs": 1},
        "traffic": {"provider": "replicas"},
    }
    spec.update(sections)
    return {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


def get_or_none(kube: KubeClient, path: str) -> JsonObject | None:
    """GET `path`, or None when it answers 404."""
    try:
        return kube.get(path)
    except KubeApiError as error:
        if error.status_code == 404:
            return None
        raise


def children(kube: KubeClient, namespace: str, owner: str) -> dict[tuple[str, str], JsonObject]:
    """Every Deployment, Service and HTTPRoute labelled as `owner`'s, by (kind, name)."""
    selector = {"labelSelector": f"{INSTANCE_LABEL}={owner}"}
    found: dict[tuple[str, str], JsonObject] = {}
    for kind in CHILD_APIS:
        for item in kube.get(child_path(kind, namespace), selector)["items"]:
            found[(kind, item["metadata"]["name"])] = item
    return found


def condition(status: Mapping[str, Any], kind: str) -> JsonObject:
    """The condition of type `kind` in `status` (KeyError when absent)."""
    for item in status.get("conditions", []):
        if item["type"] == kind:
            return dict(item)
    raise KeyError(kind)


def wait_converged(
    kube: KubeClient,
    namespace: str,
    name: str,
    *,
    ready: Mapping[str, int],
    timeout_s: float = 120.0,
) -> JsonObject:
    """Wait until status reports this generation rolled out with `ready` replicas per track.

    Returns the InferenceService as it was then.
    """

    def converged() -> JsonObject | None:
        body = kube.get(fsvc_path(namespace, name))
        status = body.get("status", {})
        tracks = status.get("tracks", {})
        counts = {track: tracks.get(track, {}).get("readyReplicas", 0) for track in ready}
        done = (
            status.get("observedGeneration") == body["metadata"]["generation"]
            and counts == dict(ready)
            and condition(status, "Progressing")["status"] == "False"
        )
        return body if done else None

    return wait_until(
        converged, timeout_s=timeout_s, what=f"{namespace}/{name} to converge with {ready}"
    )


def wait_for_object(
    kube: KubeClient, path: str, *, unlike_uid: str | None = None, timeout_s: float = 30.0
) -> JsonObject:
    """Wait until GET `path` finds an object (another one than `unlike_uid`, if given)."""

    def found() -> JsonObject | None:
        body = get_or_none(kube, path)
        return body if body is not None and body["metadata"]["uid"] != unlike_uid else None

    return wait_until(found, timeout_s=timeout_s, what=f"{path} to exist")


def process_args(pid: int) -> list[str]:
    """The command line of a running process (a pod's runtime, from the harness's pod map)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode() for part in raw.split(b"\0") if part]


def flag(args: list[str], name: str) -> str:
    """The value that follows `--name` in `args`."""
    return args[args.index(f"--{name}") + 1]


@dataclass
class OperatorProcess:
    """A running `fleetserve-operator run`, its ports and its log."""

    process: ManagedProcess
    metrics_port: int
    liveness_port: int

    @classmethod
    def start(
        cls,
        *,
        kubeconfig: Path,
        namespace: str,
        log_path: Path,
        marker: str,
        settings: Mapping[str, str] | None = None,
    ) -> OperatorProcess:
        """Start the operator watching `namespace`; returns once kopf answers /healthz.

        `settings` are extra `FLEETSERVE_*` variables (e.g. a faster rollout timer).

        Raises:
            ProcessExitedError: the operator exited while starting (the log tail says why).
            TimeoutError: it did not become live within 60 s.
        """
        metrics_port, liveness_port = free_port(), free_port()
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("FLEETSERVE_") and key.upper() not in _SCRUBBED
        }
        env.update(
            KUBECONFIG=str(kubeconfig),
            NO_PROXY="127.0.0.1,localhost",
            FLEETSERVE_NAMESPACES=json.dumps([namespace]),
            FLEETSERVE_LOG_FORMAT="plain",
            FLEETSERVE_LISTEN_ADDRESS="127.0.0.1",
            FLEETSERVE_METRICS_PORT=str(metrics_port),
            FLEETSERVE_LIVENESS_PORT=str(liveness_port),
            # A temporary error (a PVC not there yet) is retried within a test's time.
            FLEETSERVE_RETRY_DELAY_S="2",
            # The harness's cluster-down finds the operator by this marker if a run is killed.
            **{MARKER_ENV: marker},
        )
        env.update(settings or {})
        process = start_process(
            "fleetserve-operator", [str(OPERATOR), "run"], log_path=log_path, env=env
        )
        running = cls(process=process, metrics_port=metrics_port, liveness_port=liveness_port)
        try:
            wait_until(running.is_live, timeout_s=60.0, what="the operator's /healthz")
        except BaseException:
            running.stop()
            raise
        return running

    def is_live(self) -> bool:
        """Whether kopf answers its liveness probe (raises if the process has exited)."""
        self.process.ensure_running()
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        return httpx.get(url, timeout=2.0, trust_env=False).is_success

    def counters(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """The samples of counter `name` (without `_total`), keyed by their sorted labels."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = httpx.get(url, timeout=5.0, trust_env=False).text
        return {
            tuple(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            if family.name == name
            for sample in family.samples
            if sample.name == f"{name}_total"
        }

    def total(self, name: str) -> float:
        """The sum of counter `name` over all its labels."""
        return sum(self.counters(name).values())

    def log(self) -> str:
        """Everything the operator logged so far."""
        return self.process.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s (kopf stops in about 3 s)."""
        self.process.stop(grace_s=15.0)

    def kill(self) -> None:
        """SIGKILL the operator's process group at once (a crash: no clean-up runs)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.popen.wait(timeout=15.0)
