"""Helpers for e2e tests: object builders and condition waits with deadlines.

The harness's own tests and the scenario tests both use them, so they live in the package
(importable under ``--import-mode=importlib``) rather than in a conftest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from fleetserve_e2e.kubeapi import JsonObject, KubeApiError, KubeClient, namespaced
from fleetserve_e2e.waiting import wait_until

if TYPE_CHECKING:
    from fleetserve_e2e.cluster import LocalCluster

RUNTIME_IMAGE = "ghcr.io/fleetserve/fleetserve-runtime:0.1.0"
SYNTHETIC_ARGS = (
    "--model",
    "builtin://synthetic?latency_ms=5",
    "--name",
    "demo",
    "--version",
    "v1",
    "--track",
    "stable",
    "--port",
    "8080",
)


def runtime_deployment(
    name: str,
    *,
    replicas: int,
    args: Sequence[str] = SYNTHETIC_ARGS,
    labels: Mapping[str, str] | None = None,
) -> JsonObject:
    """Return a Deployment of Fleetserve runtime pods (synthetic model by default)."""
    pod_labels = {"app.kubernetes.io/name": name, **(labels or {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": pod_labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    # Short grace: scale-down tests should not wait for the 30 s default.
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "runtime",
                            "image": RUNTIME_IMAGE,
                            "command": ["fleetserve-runtime", "serve"],
                            "args": list(args),
                            "env": [{"name": "FLEETSERVE_LOG_LEVEL", "value": "info"}],
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "readinessProbe": {
                                "httpGet": {"path": "/v2/health/ready", "port": "http"}
                            },
                        }
                    ],
                },
            },
        },
    }


def is_pod_ready(pod: JsonObject) -> bool:
    """Return whether the pod's Ready condition is True."""
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def list_pods(client: KubeClient, namespace: str, selector: str = "") -> list[JsonObject]:
    """Return the pods of a namespace, optionally filtered by a label selector."""
    params = {"labelSelector": selector} if selector else None
    items: list[JsonObject] = client.get(namespaced("pods", namespace), params)["items"]
    return items


def wait_for_ready_pods(
    client: KubeClient,
    namespace: str,
    *,
    count: int,
    selector: str = "",
    timeout_s: float = 60.0,
) -> list[JsonObject]:
    """Wait until exactly ``count`` pods exist and all are Ready; return them."""

    def ready_pods() -> list[JsonObject] | None:
        pods = list_pods(client, namespace, selector)
        return pods if len(pods) == count and all(map(is_pod_ready, pods)) else None

    return wait_until(ready_pods, timeout_s=timeout_s, what=f"{count} ready pods in {namespace}")


def wait_for_no_pods(
    client: KubeClient, namespace: str, *, selector: str = "", timeout_s: float = 60.0
) -> None:
    """Wait until no pod matches in the namespace."""
    wait_until(
        lambda: not list_pods(client, namespace, selector),
        timeout_s=timeout_s,
        what=f"no pods left in {namespace}",
    )


def wait_for_deletion(client: KubeClient, path: str, *, timeout_s: float = 60.0) -> None:
    """Wait until GET ``path`` answers 404."""

    def is_gone() -> bool:
        try:
            client.get(path)
        except KubeApiError as error:
            if error.status_code == 404:
                return True
            raise
        return False

    wait_until(is_gone, timeout_s=timeout_s, what=f"{path} to be deleted")


def assert_operator_log_clean(log: str, source: str) -> None:
    """Fail when an operator's log shows a refused request (its role lacks a rule) or a traceback.

    `source` names the log in the failure message.
    """
    for needle in ("forbidden", "Traceback"):
        assert needle.lower() not in log.lower(), f"{source} has {needle!r}:\n{log[-4000:]}"


@contextmanager
def watch_history(
    cluster: LocalCluster, collection: str, current: JsonObject, read: Callable[[JsonObject], Any]
) -> Iterator[list[Any]]:
    """`read` of every version of the object `current` from now on, in order (a watch).

    The list grows in a background thread while the block runs, so a test can assert that a
    value never went back even between two of its own reads.
    """
    kube = KubeClient(cluster.server, cluster.pki)  # its own connection, for its own thread
    values = [read(current)]
    done = threading.Event()

    def watch() -> None:
        version = current["metadata"]["resourceVersion"]
        while not done.is_set():
            for event in kube.watch(collection, version, timeout_s=2):
                version = event.object["metadata"]["resourceVersion"]
                named = event.object["metadata"].get("name") == current["metadata"]["name"]
                if named and event.type in ("ADDED", "MODIFIED"):
                    values.append(read(event.object))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield values
    finally:
        done.set()
        watcher.join(timeout=10.0)
        kube.close()
