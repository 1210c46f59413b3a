"""The operator keeps the cluster matched to the spec: rolls, restores, prunes, collects.

Each test applies a one-replica synthetic InferenceService in its own namespace, with its own
operator (running as the least-privilege ServiceAccount, see conftest.py).
"""

from __future__ import annotations

import pytest

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.operator_process import (
    OperatorProcess,
    child_path,
    condition,
    fsvc_path,
    get_or_none,
)
from fleetserve_e2e.operator_testing import (
    children,
    flag,
    process_args,
    synthetic_service,
    wait_converged,
    wait_for_object,
)
from fleetserve_e2e.testing import wait_for_deletion, wait_for_no_pods, wait_for_ready_pods
from fleetserve_e2e.waiting import wait_until

NAME = "demo"
STABLE = {"stable": 1}


def _create(kube: KubeClient, namespace: str, manifest: JsonObject) -> JsonObject:
    kube.create(fsvc_path(namespace), manifest)
    name = manifest["metadata"]["name"]
    return wait_converged(kube, namespace, name, ready=STABLE)


def _runtime_flag(cluster: LocalCluster, namespace: str, name: str) -> str | None:
    """`--max-batch-size` of the one ready runtime process, once only one is left."""
    processes = [p for p in cluster.pod_addresses() if p.namespace == namespace]
    if len(processes) != 1 or not processes[0].ready:
        return None
    return flag(process_args(processes[0].pid), name)


def test_batching_change_rolls_the_pods(
    crd: LocalCluster, kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """A new `spec.batching` reaches the Deployment, and new pods run with the new args.

    It is a change of the GPU track, so it is rolled out: a canary runs it first,
    then the stable track. One 100% step without analysis keeps that short.
    """
    quick = {"steps": [100], "interval": "1s"}
    _create(kube, namespace, synthetic_service(NAME, rollout=quick))
    old_pod = wait_for_ready_pods(kube, namespace, count=1)[0]["metadata"]["uid"]

    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"batching": {"maxBatchSize": 7}}})

    def stable_batch_size() -> bool:
        deployment = kube.get(child_path("Deployment", namespace, f"{NAME}-stable"))
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        return flag(args, "max-batch-size") == "7"

    wait_until(stable_batch_size, timeout_s=90.0, what="the stable track on the new batching")
    body = wait_converged(kube, namespace, NAME, ready=STABLE)
    assert body["metadata"]["generation"] == 2
    wait_until(
        lambda: _runtime_flag(crd, namespace, "max-batch-size") == "7",
        timeout_s=60.0,
        what="the new runtime process alone",
    )
    new_pod = wait_for_ready_pods(kube, namespace, count=1)[0]["metadata"]["uid"]
    assert new_pod != old_pod


def test_deleted_children_are_restored(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """Deleting the Deployment or a Service brings a new one back, with the same spec."""
    _create(kube, namespace, synthetic_service(NAME))
    for kind, name in (("Deployment", f"{NAME}-stable"), ("Service", NAME)):
        path = child_path(kind, namespace, name)
        old = kube.get(path)
        kube.delete(path)
        new = wait_for_object(kube, path, unlike_uid=old["metadata"]["uid"])
        assert new["metadata"]["labels"] == old["metadata"]["labels"]
        assert new["spec"]["selector"] == old["spec"]["selector"]
    wait_converged(kube, namespace, NAME, ready=STABLE)


def test_edited_fields_are_restored_but_foreign_ones_kept(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """Fields the operator owns go back; an annotation someone else added stays."""
    _create(kube, namespace, synthetic_service(NAME))
    deployment = child_path("Deployment", namespace, f"{NAME}-stable")
    service = child_path("Service", namespace, f"{NAME}-stable")
    kube.merge_patch(
        deployment,
        {
            "metadata": {"annotations": {"example.com/owner": "ml-team"}},
            "spec": {"revisionHistoryLimit": 9},
        },
    )
    # A merge patch replaces the whole list: the same port (80/TCP) with another target.
    port = {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}
    kube.merge_patch(service, {"spec": {"ports": [port]}})

    wait_until(
        lambda: kube.get(deployment)["spec"]["revisionHistoryLimit"] == 3,
        timeout_s=30.0,
        what="revisionHistoryLimit restored",
    )
    wait_until(
        lambda: kube.get(service)["spec"]["ports"][0]["targetPort"] == "http",
        timeout_s=30.0,
        what="the Service's targetPort restored",
    )
    assert kube.get(deployment)["metadata"]["annotations"]["example.com/owner"] == "ml-team"


def _route_weights(route: JsonObject) -> list[tuple[str, int]]:
    return [
        (ref["name"], ref["weight"])
        for rule in route["spec"]["rules"]
        for ref in rule["backendRefs"]
    ]


def test_edited_route_weights_are_restored_at_once(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """A hand-edited HTTPRoute weight goes back on its watch event, well before a resync.

    The operator's resync runs every 60 s here; the 20 s bound shows the watch did it.
    """
    manifest = synthetic_service(
        NAME, traffic={"provider": "gateway-api", "parentRefs": [{"name": "gw"}]}
    )
    _create(kube, namespace, manifest)
    path = child_path("HTTPRoute", namespace, NAME)
    route = kube.get(path)
    wanted = _route_weights(route)
    rules = route["spec"]["rules"]
    for rule in rules:
        for ref in rule["backendRefs"]:
            ref["weight"] = 7
    kube.merge_patch(path, {"spec": {"rules": rules}})
    wait_until(
        lambda: _route_weights(kube.get(path)) == wanted,
        timeout_s=20.0,
        what=f"the route's weights {wanted} restored",
    )


def test_autoscaled_replicas_are_left_alone(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """With min < max the replica count is an autoscaler's: scaling it is no drift."""
    manifest = synthetic_service(NAME, runtime={"replicas": {"min": 1, "max": 2}, "device": "cpu"})
    kube.create(fsvc_path(namespace), manifest)
    wait_converged(kube, namespace, NAME, ready=STABLE)
    writes = operator.counters("fleetserve_operator_writes")

    # What the HorizontalPodAutoscaler does: write the scale subresource.
    scale = child_path("Deployment", namespace, f"{NAME}-stable") + "/scale"
    kube.merge_patch(scale, {"spec": {"replicas": 2}})
    body = wait_converged(kube, namespace, NAME, ready={"stable": 2})
    assert body["status"]["tracks"]["stable"]["replicas"] == 2
    assert kube.get(scale)["spec"]["replicas"] == 2
    after = operator.counters("fleetserve_operator_writes")
    assert {k: v for k, v in after.items() if ("kind", "Deployment") in k} == {
        k: v for k, v in writes.items() if ("kind", "Deployment") in k
    }


def test_children_no_longer_wanted_are_deleted(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """Turning the fallback and the Gateway API off deletes their Deployment, Service, route."""
    manifest = synthetic_service(
        NAME,
        fallback={"enabled": True, "replicas": {"min": 0, "max": 1}},
        traffic={"provider": "gateway-api", "parentRefs": [{"name": "gw"}]},
    )
    kube.create(fsvc_path(namespace), manifest)
    wait_converged(kube, namespace, NAME, ready={"stable": 1, "fallback": 0})
    before = set(children(kube, namespace, NAME))
    assert {("Deployment", f"{NAME}-fallback"), ("HTTPRoute", NAME)} <= before

    patch = {"spec": {"fallback": {"enabled": False}, "traffic": {"provider": "replicas"}}}
    kube.merge_patch(fsvc_path(namespace, NAME), patch)
    for kind, name in (
        ("Deployment", f"{NAME}-fallback"),
        ("Service", f"{NAME}-fallback"),
        ("HTTPRoute", NAME),
    ):
        wait_for_deletion(kube, child_path(kind, namespace, name), timeout_s=30.0)
    wait_converged(kube, namespace, NAME, ready=STABLE)
    # Status is written ahead of the deletions (a restarted operator renders from it), then
    # again once they are done: the fallback track leaves it with that second write.
    wait_until(
        lambda: "fallback" not in kube.get(fsvc_path(namespace, NAME))["status"]["tracks"] or None,
        timeout_s=30.0,
        what="the fallback track to leave status",
    )


def test_deleting_the_service_collects_its_children(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """Owner references let the garbage collector delete every child, and the pods go too."""
    _create(kube, namespace, synthetic_service(NAME))
    assert children(kube, namespace, NAME)
    kube.delete(fsvc_path(namespace, NAME))
    wait_for_deletion(kube, fsvc_path(namespace, NAME), timeout_s=30.0)
    wait_until(
        lambda: not children(kube, namespace, NAME), timeout_s=60.0, what="children collected"
    )
    wait_for_no_pods(kube, namespace, timeout_s=60.0)


@pytest.mark.parametrize(
    ("uri", "reason", "field"),
    [
        pytest.param(
            "builtin://no-such-model", "InvalidSpec", "spec.model.uri", id="unknown-builtin"
        ),
        pytest.param(
            "pvc://models/encoder.pt", "DependencyMissing", "spec.model.uri", id="missing-pvc"
        ),
    ],
)
def test_semantic_errors_are_degraded_naming_the_field(
    kube: KubeClient,
    namespace: str,
    operator: OperatorProcess,
    uri: str,
    reason: str,
    field: str,
) -> None:
    """What the schema lets through but cannot run is a Degraded condition; nothing is applied."""
    manifest = synthetic_service(NAME, model={"name": NAME, "version": "1", "uri": uri})
    kube.create(fsvc_path(namespace), manifest)

    def degraded() -> JsonObject | None:
        status = kube.get(fsvc_path(namespace, NAME)).get("status", {})
        found = condition(status, "Degraded")
        return found if found["status"] == "True" else None

    found = wait_until(degraded, timeout_s=30.0, what="the Degraded condition")
    assert found["reason"] == reason
    assert field in found["message"]
    assert get_or_none(kube, child_path("Deployment", namespace, f"{NAME}-stable")) is None
