"""The resync lane heals what no watch reports, in a real operator.

A missing PVC is a temporary error, retried after `FLEETSERVE_RETRY_DELAY_S`; PVCs are not
watched. With that delay far beyond the test, only the resync lane (one thread visiting every
InferenceService each `FLEETSERVE_RESYNC_INTERVAL_S`, started by kopf's startup activity) can
notice the PVC that appears, and build the children.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetserve_e2e import KubeClient
from fleetserve_e2e.operator_process import OperatorProcess, fsvc_path
from fleetserve_e2e.operator_testing import children, synthetic_service, wait_condition
from fleetserve_e2e.waiting import wait_until

NAME = "resynced"


def test_a_pvc_that_appears_is_noticed_by_the_resync_lane(
    kube: KubeClient, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    """Degraded for a missing PVC; once it exists, the next resync round writes the children."""
    operator = start_operator(
        {"FLEETSERVE_RETRY_DELAY_S": "3600", "FLEETSERVE_RESYNC_INTERVAL_S": "2"}
    )
    model = {"name": NAME, "version": "1", "uri": "pvc://models/encoder.pt"}
    kube.create(fsvc_path(namespace), synthetic_service(NAME, model=model))
    wait_condition(kube, namespace, NAME, "Degraded", reason="DependencyMissing")
    assert children(kube, namespace, NAME) == {}
    claim = {
        "metadata": {"name": "models"},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kube.create(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", claim)
    # The children are written side by side: the Service may be there before the Deployment.
    wait_until(
        lambda: ("Deployment", f"{NAME}-stable") in children(kube, namespace, NAME),
        timeout_s=30.0,
        what="the stable Deployment after the PVC appeared",
    )

    def resynced() -> bool:
        counted = operator.counters("fleetserve_operator_reconciles")
        return any(dict(labels)["trigger"] == "resync" for labels in counted)

    # The visit that wrote the children is counted when it ends, after its status write.
    wait_until(resynced, timeout_s=30.0, what="a reconcile counted with trigger=resync")
