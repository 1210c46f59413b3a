"""Helpers of the operator e2e tests: build InferenceServices, read children and statuses.

The operator process, the CRD, the least-privilege identity and the documented names live in
`fleetserve_e2e.operator_process`, which the demo shares; what is here serves only the tests
(`operator_e2e/`, `rollout_e2e/`). Every wait has a deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetserve_e2e import KubeClient
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.operator_process import (
    CHILD_APIS,
    GROUP_VERSION,
    INSTANCE_LABEL,
    KIND,
    child_path,
    condition,
    fsvc_path,
    get_or_none,
)
from fleetserve_e2e.pod_launch import flag_value
from fleetserve_e2e.waiting import wait_until


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


def children(kube: KubeClient, namespace: str, owner: str) -> dict[tuple[str, str], JsonObject]:
    """Every Deployment, Service and HTTPRoute labelled as `owner`'s, by (kind, name)."""
    selector = {"labelSelector": f"{INSTANCE_LABEL}={owner}"}
    found: dict[tuple[str, str], JsonObject] = {}
    for kind in CHILD_APIS:
        for item in kube.get(child_path(kind, namespace), selector)["items"]:
            found[(kind, item["metadata"]["name"])] = item
    return found


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
    """The value of `--name` in `args` (either spelling); fails when it is not there."""
    value = flag_value(args, f"--{name}")
    assert value is not None, f"--{name} is not in {args}"
    return value


def wait_condition(
    kube: KubeClient,
    namespace: str,
    name: str,
    kind: str,
    *,
    status: str = "True",
    reason: str | None = None,
    timeout_s: float = 60.0,
) -> JsonObject:
    """Wait until the InferenceService's condition `kind` has `status` (and `reason`)."""

    def reached() -> JsonObject | None:
        found = condition(kube.get(fsvc_path(namespace, name)).get("status", {}), kind)
        wanted = found["status"] == status and reason in (None, found["reason"])
        return found if wanted else None

    return wait_until(
        reached, timeout_s=timeout_s, what=f"{kind}={status} ({reason}) on {namespace}/{name}"
    )


def service_events(kube: KubeClient, namespace: str, name: str) -> list[JsonObject]:
    """The Events posted on InferenceService `name`, oldest first as the API server lists them."""
    items: list[JsonObject] = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [
        event
        for event in items
        if event["involvedObject"].get("kind") == KIND and event["involvedObject"]["name"] == name
    ]


def warning_events(kube: KubeClient, namespace: str, name: str) -> list[JsonObject]:
    """The Warning Events posted on InferenceService `name`."""
    return [e for e in service_events(kube, namespace, name) if e["type"] == "Warning"]


def wait_for_events(
    kube: KubeClient, namespace: str, name: str, *reasons: str, timeout_s: float = 15.0
) -> list[str]:
    """Wait until Events with every one of `reasons` are posted; return all the reasons.

    The operator posts Events from a thread of its own, after the status write that a test
    usually waits for, so an Event is awaited, never read once.
    """

    def posted() -> list[str] | None:
        found = [e["reason"] for e in service_events(kube, namespace, name)]
        return found if set(reasons) <= set(found) else None

    return wait_until(posted, timeout_s=timeout_s, what=f"Events {', '.join(reasons)} on {name}")


def route_forwards(route: JsonObject, path: str) -> bool:
    """Whether a Gateway sends a request for `path` to the HTTPRoute's backends.

    Gateway API path matching: `Exact` takes the path itself; `PathPrefix` matches whole path
    elements (`/v2/models/demo` takes `/v2/models/demo/infer`, not `/v2/models/demo2`), so
    `/` takes everything. A rule without matches has the API server's default, `/`.
    """
    for rule in route["spec"].get("rules", []):
        for match in rule.get("matches", [{"path": {"type": "PathPrefix", "value": "/"}}]):
            kind, value = match["path"]["type"], match["path"]["value"]
            if kind == "Exact" and path == value:
                return True
            prefix = value.rstrip("/")
            if kind == "PathPrefix" and (path == prefix or path.startswith(prefix + "/")):
                return True
    return False
