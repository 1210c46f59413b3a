"""The operator writes only its own children, all or none, and routes only inference.

Each test runs its own operator (least-privilege ServiceAccount, see conftest.py) against the
real API server: its ownership checks, dry-runs, quota and Gateway API schema are the real ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.operator_process import MANAGER, OperatorProcess, child_path, fsvc_path
from fleetserve_e2e.operator_testing import (
    children,
    route_forwards,
    service_events,
    synthetic_service,
    wait_condition,
    wait_converged,
    wait_for_events,
    warning_events,
)
from fleetserve_e2e.testing import wait_for_deletion
from fleetserve_e2e.waiting import wait_until

NAME = "demo"
GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gateway"}]}


def _foreign_service(kube: KubeClient, namespace: str) -> JsonObject:
    """A Service another team owns, named like the InferenceService's umbrella Service."""
    service = {
        "metadata": {"name": NAME, "labels": {"app": "billing"}},
        "spec": {"selector": {"app": "billing"}, "ports": [{"port": 443, "targetPort": 8443}]},
    }
    return kube.create(child_path("Service", namespace), service)


def test_an_existing_service_is_never_taken_over(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """Named after someone's Service: ChildConflict, nothing built, the Service untouched.

    It keeps its spec, owners and resourceVersion. Once it is gone, the fleet is built.
    """
    theirs = _foreign_service(kube, namespace)
    kube.create(fsvc_path(namespace), synthetic_service(NAME))

    ready = wait_condition(kube, namespace, NAME, "Ready", status="False", reason="ChildConflict")
    assert f"Service {namespace}/{NAME} already exists" in ready["message"]
    assert wait_condition(kube, namespace, NAME, "Degraded")["reason"] == "ChildConflict"
    wait_for_events(kube, namespace, NAME, "ChildConflict")
    events = [e for e in warning_events(kube, namespace, NAME) if e["reason"] == "ChildConflict"]
    assert f"Service {namespace}/{NAME}" in events[0]["message"]
    after = kube.get(child_path("Service", namespace, NAME))
    assert after["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    assert "ownerReferences" not in after["metadata"]
    assert children(kube, namespace, NAME) == {}, "a child was created next to the conflict"

    kube.delete(child_path("Service", namespace, NAME))
    wait_converged(kube, namespace, NAME, ready={"stable": 1})


def test_a_refused_child_leaves_nothing_half_built(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """The Gateway API schema refuses the HTTPRoute: nothing is left built, status says why.

    Two parentRefs to one Gateway without distinct sectionNames pass the InferenceService's
    schema but not the HTTPRoute's. The service's first create, made without dry-runs,
    creates the Services before the route and the Deployment last: the Deployment is never
    created, and the Services are deleted again.
    """
    twice = {**GATEWAY, "parentRefs": [{"name": "gateway"}, {"name": "gateway"}]}
    kube.create(fsvc_path(namespace), synthetic_service(NAME, traffic=twice))

    degraded = wait_condition(kube, namespace, NAME, "Degraded", reason="ChildRefused")
    assert f"HTTPRoute {NAME} refused by the API server" in degraded["message"]
    assert "sectionName must be unique" in degraded["message"]
    wait_condition(kube, namespace, NAME, "Ready", status="False", reason="ChildRefused")
    assert children(kube, namespace, NAME) == {}
    wait_for_events(kube, namespace, NAME, "ChildRefused")
    normal = " ".join(
        e["message"] for e in service_events(kube, namespace, NAME) if e["type"] == "Normal"
    )
    assert f"Deleted Service {NAME}" in normal
    assert "Deployment" not in normal

    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"traffic": GATEWAY}})
    wait_converged(kube, namespace, NAME, ready={"stable": 1})


def test_a_created_childs_first_apply_removes_what_the_spec_stopped_asking_for(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """Created by a POST, a child's fields are the operator's by that create until it applies.

    Its first apply takes them over, so a field the spec stops asking for goes: clearing the
    hostnames clears the route's, and the operator owns the route by apply alone.
    """
    with_host = {**GATEWAY, "hostnames": ["models.example.com"]}
    kube.create(fsvc_path(namespace), synthetic_service(NAME, traffic=with_host))
    wait_converged(kube, namespace, NAME, ready={"stable": 1})
    for (kind, name), child in children(kube, namespace, NAME).items():
        entries = [e for e in child["metadata"]["managedFields"] if e["manager"] == MANAGER]
        assert [e["operation"] for e in entries] == ["Update"], (kind, name, entries)
    route = child_path("HTTPRoute", namespace, NAME)
    assert kube.get(route)["spec"]["hostnames"] == ["models.example.com"]
    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"traffic": {"hostnames": None}}})
    wait_until(lambda: "hostnames" not in kube.get(route)["spec"], timeout_s=30.0,
               what="the route's hostnames to go")  # fmt: skip
    entries = [e for e in kube.get(route)["metadata"]["managedFields"] if e["manager"] == MANAGER]
    assert [e["operation"] for e in entries] == ["Apply"]


INFERENCE = [
    ("POST", f"/v2/models/{NAME}/infer",
     {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}),
    ("POST", f"/v2/models/{NAME}/versions/1/infer",
     {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}),
    ("POST", f"/v1/models/{NAME}:predict", {"instances": ["hi"]}),
    ("GET", f"/v2/models/{NAME}", None),
    ("GET", f"/v2/models/{NAME}/ready", None),
]  # fmt: skip
ADMIN = [
    "/",
    "/v2/repository/models/demo/load",
    "/v2/repository/models/demo/unload",
    "/metrics",
    "/docs",
    "/openapi.json",
    "/v2",
    "/v2/health/ready",
    "/v2/models/demo2/infer",
]


def test_the_route_exposes_inference_only(
    kube: KubeClient, local_cluster: LocalCluster, namespace: str, operator: OperatorProcess
) -> None:
    """The stored HTTPRoute forwards the model's inference paths, and no admin path.

    Read back from the API server (validated, defaulted); each forwarded path is answered
    by the runtime.
    """
    kube.create(fsvc_path(namespace), synthetic_service(NAME, traffic=GATEWAY))
    wait_converged(kube, namespace, NAME, ready={"stable": 1})
    route = kube.get(child_path("HTTPRoute", namespace, NAME))
    (pod,) = [p for p in local_cluster.pod_addresses() if p.namespace == namespace]
    for method, path, body in INFERENCE:
        assert route_forwards(route, path), f"{path} is not routed"
        answer = httpx.request(method, pod.url + path, json=body, timeout=10.0, trust_env=False)
        assert answer.status_code == 200, f"{method} {path}: {answer.status_code} {answer.text}"
    exposed = [path for path in ADMIN if route_forwards(route, path)]
    assert exposed == [], f"the gateway would forward {exposed}"


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param("conflict", id="name-taken"),
        pytest.param("pvc", id="missing-pvc"),
    ],
)
def test_a_broken_service_is_deleted_at_once(
    kube: KubeClient,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    broken: str,
) -> None:
    """With the default 30 s retry delay, a failing service's finalizer goes within seconds."""
    start_operator({"FLEETSERVE_RETRY_DELAY_S": "30"})
    if broken == "conflict":
        _foreign_service(kube, namespace)
        manifest = synthetic_service(NAME)
    else:
        model = {"name": NAME, "version": "1", "uri": "pvc://models/encoder.pt"}
        manifest = synthetic_service(NAME, model=model)
    kube.create(fsvc_path(namespace), manifest)
    wait_condition(kube, namespace, NAME, "Degraded")
    started = time.monotonic()
    kube.delete(fsvc_path(namespace, NAME))
    wait_for_deletion(kube, fsvc_path(namespace, NAME), timeout_s=30.0)
    took_s = time.monotonic() - started
    assert took_s < 5.0, f"deletion took {took_s:.1f} s"
