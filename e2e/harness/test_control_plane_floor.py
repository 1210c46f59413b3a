"""The floor makes what the operator makes: the children of a service's first reconcile.

No cluster: the operator's `Sync` reconciles the bench's service against `FakeKube`, and the
children it creates are compared with the floor's by the hash the operator stamps on each
rendered child (the server's own fields, a uid or managedFields, are not rendered).
"""

from __future__ import annotations

from fleetserve_operator import naming, render
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.testing import FakeKube

from fleetserve_e2e.control_plane_floor import floor_children
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.operator_scale import NAMESPACE, bench_service


def _as_created(name: str) -> JsonObject:
    """The bench's service as the API server returns it from the create."""
    service = bench_service(name)
    service["metadata"].update(namespace=NAMESPACE, uid=f"uid-{name}", generation=1)
    return service


def _hashes(children: list[JsonObject]) -> dict[tuple[str, str], str]:
    return {
        render.child_key(child): child["metadata"]["annotations"][render.APPLIED_HASH_ANNOTATION]
        for child in children
    }


def test_the_floor_creates_the_children_of_the_operators_first_reconcile() -> None:
    """The same four children, rendered alike, owned by the service the API server made."""
    service = _as_created("svc-0007")
    kube = FakeKube()
    kube.add_service(service)
    assert (
        Sync(kube, metrics=OperatorMetrics()).run_by_name(NAMESPACE, "svc-0007", trigger="create")
        is None
    )
    made = [obj for (kind, _, _), obj in kube.objects.items() if kind != naming.KIND]
    floor = floor_children(service)
    assert len(floor) == 4  # the stable Deployment, its budget, its Service, the umbrella
    assert _hashes(floor) == _hashes(made)
    for child in floor:
        owner = child["metadata"]["ownerReferences"][0]
        assert (owner["name"], owner["uid"]) == ("svc-0007", "uid-svc-0007")
