"""spec.scaling against the real API server: KEDA's ScaledObject, the PDB, spreading, HPA replicas.

The ScaledObject CRD is KEDA's own (from the pinned Go module); KEDA itself does not run here,
so the test plays the HorizontalPodAutoscaler by writing the Deployment's scale subresource.
The first test runs before the CRD is installed in the session's cluster, then installs it.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.keda import SCALED_OBJECT_CRD, keda_crd_dir
from fleetserve_e2e.kubeapi import namespaced
from fleetserve_e2e.operator_process import OperatorProcess, child_path, fsvc_path, get_or_none
from fleetserve_e2e.operator_testing import (
    synthetic_service,
    wait_condition,
    wait_converged,
    wait_for_object,
)
from fleetserve_e2e.waiting import wait_until

NAME = "demo"
PROMETHEUS = "http://127.0.0.1:9"
"""Where the ScaledObject's trigger would read; no KEDA runs to read it."""
SETTINGS = {"FLEETSERVE_PROMETHEUS_URL": PROMETHEUS}
SCALING = {"minReplicas": 1, "maxReplicas": 3, "metric": "inflightRequests", "target": 2}
TRACK_SELECTOR = {
    "app.kubernetes.io/name": "fleetserve-runtime",
    "app.kubernetes.io/instance": NAME,
    "serving.fleetserve.io/track": "stable",
}


def _scaled_object_path(namespace: str, name: str = "") -> str:
    return namespaced("scaledobjects", namespace, name, group_version="keda.sh/v1alpha1")


def _pdb_path(namespace: str, name: str = "") -> str:
    return namespaced("poddisruptionbudgets", namespace, name, group_version="policy/v1")


def _install_scaled_object_crd(cluster: LocalCluster) -> None:
    cluster.apply_crds(
        keda_crd_dir() / "keda.sh_scaledobjects.yaml", SCALED_OBJECT_CRD, timeout_s=60
    )


def test_without_keda_status_names_spec_scaling_until_the_crd_appears(
    crd: LocalCluster,
    kube: KubeClient,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """No ScaledObject API: Degraded DependencyMissing naming spec.scaling; then it builds.

    The operator neither crashes nor creates half the children; once KEDA's CRD is there,
    its retry builds the Deployment, the ScaledObject on it and the PodDisruptionBudget.
    """
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{SCALED_OBJECT_CRD}"
    assert get_or_none(kube, crd_path) is None, "run before KEDA's CRDs are installed"
    start_operator(SETTINGS)
    kube.create(fsvc_path(namespace), synthetic_service(NAME, scaling=SCALING))

    degraded = wait_condition(kube, namespace, NAME, "Degraded", reason="DependencyMissing")
    assert degraded["message"].startswith("spec.scaling: autoscaling needs KEDA")
    stable = child_path("Deployment", namespace, f"{NAME}-stable")
    assert get_or_none(kube, stable) is None, "a child was created without its ScaledObject"

    _install_scaled_object_crd(crd)
    scaled = wait_for_object(kube, _scaled_object_path(namespace, f"{NAME}-stable"), timeout_s=60)
    assert scaled["spec"]["scaleTargetRef"]["name"] == f"{NAME}-stable"
    assert scaled["spec"]["triggers"][0]["metadata"]["serverAddress"] == PROMETHEUS
    assert scaled["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    wait_converged(kube, namespace, NAME, ready={"stable": 1})
    assert wait_condition(kube, namespace, NAME, "Degraded", status="False")


def test_hpa_replicas_stay_and_pods_get_a_budget_and_spread(
    crd: LocalCluster,
    kube: KubeClient,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """The HPA's replica count is never written back; PDB and spread select the track's pods.

    A ScaledObject edited by hand is restored; turning scaling off deletes it and the
    operator takes the count back.
    """
    _install_scaled_object_crd(crd)
    operator = start_operator(SETTINGS)
    kube.create(fsvc_path(namespace), synthetic_service(NAME, scaling=SCALING))
    wait_converged(kube, namespace, NAME, ready={"stable": 1})

    stable = child_path("Deployment", namespace, f"{NAME}-stable")
    template = kube.get(stable)["spec"]["template"]["spec"]
    (host, zone) = template["topologySpreadConstraints"]
    assert (host["topologyKey"], host["whenUnsatisfiable"]) == (
        "kubernetes.io/hostname",
        "ScheduleAnyway",
    )
    assert zone["topologyKey"] == "topology.kubernetes.io/zone"
    assert host["labelSelector"]["matchLabels"] == TRACK_SELECTOR
    budget = kube.get(_pdb_path(namespace, f"{NAME}-stable"))
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == TRACK_SELECTOR

    writes = operator.counters("fleetserve_operator_writes")
    # What the HorizontalPodAutoscaler does: write the scale subresource.
    scale = f"{stable}/scale"
    kube.merge_patch(scale, {"spec": {"replicas": 2}})
    wait_converged(kube, namespace, NAME, ready={"stable": 2})
    assert kube.get(scale)["spec"]["replicas"] == 2
    after = operator.counters("fleetserve_operator_writes")
    assert {k: v for k, v in after.items() if ("kind", "Deployment") in k} == {
        k: v for k, v in writes.items() if ("kind", "Deployment") in k
    }

    scaled = _scaled_object_path(namespace, f"{NAME}-stable")
    kube.merge_patch(scaled, {"spec": {"maxReplicaCount": 10}})
    wait_until(
        lambda: kube.get(scaled)["spec"]["maxReplicaCount"] == SCALING["maxReplicas"],
        timeout_s=30,
        what="the ScaledObject edited by hand to be restored",
    )

    kube.merge_patch(
        fsvc_path(namespace, NAME),
        {"spec": {"scaling": None, "runtime": {"replicas": {"min": 3, "max": 3}}}},
    )
    wait_until(
        lambda: get_or_none(kube, scaled) is None,
        timeout_s=60,
        what="the ScaledObject to be deleted",
    )
    wait_converged(kube, namespace, NAME, ready={"stable": 3})
