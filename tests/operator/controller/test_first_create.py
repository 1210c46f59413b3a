"""A service's first create: no dry-runs, the Deployments last, undone on a refusal.

Its first reconcile (no status written, nothing of it found) creates the children without
checking each first, and deletes what it created when one is refused, so it ends as a
checked create does: nothing built, no pod started, the rollout where it was. A later
reconcile dry-runs every write.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fleetserve_operator import naming, render
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import ClusterUnavailable, DependencyMissing
from fleetserve_operator.records import Manifest
from fleetserve_operator.spec import ConditionType, InferenceServiceStatus
from fleetserve_operator.testing import FakeKube, FakeMetricSource, make_service

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}]}
MODEL = {"name": "demo", "version": "1", "uri": "builtin://synthetic"}
EVERY_KIND = {
    "model": MODEL,
    "traffic": GATEWAY,
    "scaling": {"minReplicas": 2, "maxReplicas": 4, "target": 2},
}
"""Services, a budget, a route, a Deployment and a scaler."""


class _CheckingKube(FakeKube):
    """`FakeKube` that records each dry-run, and can fail chosen writes or deletes."""

    def __init__(self) -> None:
        super().__init__()
        self.dry_runs: list[tuple[str, str]] = []
        self._creating = False
        self.unavailable: set[tuple[str, str]] = set()
        """(action, kind) the API server fails with a 5xx, as `create` or `delete`."""
        self.missing: set[str] = set()
        """Kinds whose API is not served (a CRD not installed)."""

    def validate(self, manifest: Manifest, *, current: Manifest | None) -> None:
        """Recorded (unless a create checks itself), then checked as `FakeKube` checks it."""
        if not self._creating:
            self.dry_runs.append(render.child_key(manifest))
        if manifest["kind"] in self.missing:
            raise DependencyMissing("spec.traffic", f"the {manifest['kind']} API is not served")
        super().validate(manifest, current=current)

    def create(self, manifest: Manifest) -> Manifest:
        """Fails where `unavailable` says so."""
        if ("create", manifest["kind"]) in self.unavailable:
            raise ClusterUnavailable(f"create {manifest['kind']}: 503")
        self._creating = True
        try:
            return super().create(manifest)
        finally:
            self._creating = False

    def delete(self, manifest: Manifest) -> None:
        """Fails where `unavailable` says so."""
        if ("delete", manifest["kind"]) in self.unavailable:
            raise ClusterUnavailable(f"delete {manifest['kind']}: 503")
        super().delete(manifest)


def _setup(spec: dict[str, Any]) -> tuple[_CheckingKube, Sync]:
    kube = _CheckingKube()
    kube.add_service(make_service(spec))
    sync = Sync(
        kube,
        metrics=OperatorMetrics(),
        default_prometheus_url="http://prometheus:9090",
        metric_source=lambda url: FakeMetricSource(),
    )
    return kube, sync


def _refused(kind: str, message: str) -> _CheckingKube:
    """A service of every kind created, `kind` refused with `message`: ChildRefused."""
    kube, sync = _setup(EVERY_KIND)
    kube.refusals[(kind, "demo-stable")] = message
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.reason == "ChildRefused"
    return kube


def _stored(kube: FakeKube) -> list[Manifest]:
    return [obj for (kind, _, _), obj in kube.objects.items() if kind != naming.KIND]


def _child_writes(kube: FakeKube) -> list[tuple[str, str]]:
    return [(action, kind) for action, kind, _ in kube.writes if kind != naming.KIND]


def _children(kube: FakeKube) -> list[tuple[str, str]]:
    return sorted((kind, name) for kind, _, name in kube.objects if kind != naming.KIND)


def test_a_first_create_dry_runs_only_what_comes_after_the_deployments() -> None:
    """Services and budget, then the route, then the Deployment, then its scaler.

    Only the scaler, made once pods have started, is dry-run.
    """
    kube, sync = _setup(EVERY_KIND)
    assert sync.run_by_name("ns", "demo", trigger="create") is None
    assert kube.dry_runs == [("ScaledObject", "demo-stable")]
    writes = _child_writes(kube)
    assert sorted(writes[:3]) == [
        ("create", "PodDisruptionBudget"),
        ("create", "Service"),
        ("create", "Service"),
    ]
    assert writes[3:] == [
        ("create", "HTTPRoute"),
        ("create", "Deployment"),
        ("create", "ScaledObject"),
    ]


def test_a_later_reconcile_dry_runs_every_write() -> None:
    """A status was written (the service is no longer new): every create is checked first."""
    kube, sync = _setup(EVERY_KIND)
    kube.objects[(naming.KIND, "ns", "demo")]["status"] = {"phase": "Pending"}
    assert sync.run_by_name("ns", "demo", trigger="create") is None
    assert sorted(kube.dry_runs) == sorted(render.child_key(c) for c in _stored(kube))


def test_a_refused_deployment_undoes_everything_made_before_it() -> None:
    """No pod ever started; the status is the refusal's, as after a refused dry-run."""
    kube = _refused("Deployment", "denied by policy: no privileged pods")
    assert _children(kube) == []
    assert ("create", "Deployment") not in _child_writes(kube)
    deleted = [kind for action, kind in _child_writes(kube) if action == "delete"]
    assert deleted[0] == "HTTPRoute", "a route goes before the Services it names"
    assert sorted(deleted[1:]) == ["PodDisruptionBudget", "Service", "Service"]
    status = kube.status_of("ns", "demo")
    assert status.phase == "Failed"
    degraded = status.condition(ConditionType.DEGRADED)
    assert degraded is not None
    assert (degraded.status, degraded.reason) == ("True", "ChildRefused")
    assert "no privileged pods" in degraded.message


@pytest.mark.parametrize("first", [True, False], ids=["first-create", "checked"])
def test_a_refused_create_leaves_the_rollout_where_it_was(first: bool) -> None:
    """Undone, the first create reports what a refused dry-run reports: no step was taken.

    The first step records the stable spec it rolls out; refused, nothing is recorded.
    """
    kube, sync = _setup(EVERY_KIND)
    if not first:
        kube.objects[(naming.KIND, "ns", "demo")]["status"] = {"phase": "Pending"}
    kube.refusals[("Deployment", "demo-stable")] = "denied by policy"
    sync.run_by_name("ns", "demo", trigger="create")
    status = kube.status_of("ns", "demo")
    assert status.phase == "Failed"
    assert status.rollout == InferenceServiceStatus().rollout
    kube.refusals.clear()
    assert sync.run_by_name("ns", "demo", trigger="resync") is None
    assert kube.status_of("ns", "demo").rollout.stable_spec is not None


def test_a_refused_scaler_stops_the_create_before_anything_is_written() -> None:
    """The scaler comes after the Deployment, so its dry-run runs before any create."""
    kube = _refused("ScaledObject", "admission webhook denied it")
    assert kube.dry_runs == [("ScaledObject", "demo-stable")]
    assert _child_writes(kube) == []


def test_a_missing_route_api_undoes_the_services() -> None:
    """No Gateway API: the route's create fails, the Services made before it go again."""
    kube, sync = _setup({"model": MODEL, "traffic": GATEWAY})
    kube.missing.add("HTTPRoute")
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.reason == "DependencyMissing"
    assert _children(kube) == []
    assert ("create", "Deployment") not in _child_writes(kube)


@pytest.mark.timeout(30)
def test_an_api_server_failure_beside_a_refusal_is_undone_too() -> None:
    """The budget's create fails (503), a Service is refused, the other Service is made.

    Made at once, the first failure in call order (the 503) is the one raised, and it hides
    the refusal: the Service made goes again all the same. The next reconcile dry-runs
    every write and builds the service.
    """
    kube = _CheckingKube()
    kube.add_service(make_service({"model": MODEL}))
    sync = Sync(kube, metrics=OperatorMetrics(), write_threads=2)
    kube.unavailable.add(("create", "PodDisruptionBudget"))
    kube.refusals[("Service", "demo")] = "quota exceeded"
    spec = kube.objects[(naming.KIND, "ns", "demo")]["spec"]
    spec["runtime"] = {"replicas": {"min": 2, "max": 2}}
    with pytest.raises(ClusterUnavailable):
        sync.run_by_name("ns", "demo", trigger="create")
    assert _children(kube) == []
    kube.unavailable.clear()
    kube.refusals.clear()
    kube.dry_runs.clear()
    assert sync.run_by_name("ns", "demo", trigger="retry") is None
    assert sorted(kube.dry_runs) == _children(kube)
    assert ("Deployment", "demo-stable") in _children(kube)


def test_an_unlabelled_child_of_its_own_is_applied_onto_and_kept_by_the_undo() -> None:
    """Its own Service without labels (not listed, so still a first create) stays.

    The create finds the name taken by a child of this service and applies onto it; the
    Deployment's refusal then undoes only what this reconcile created.
    """
    kube, sync = _setup({"model": MODEL})
    built, built_sync = _setup({"model": MODEL})
    assert built_sync.run_by_name("ns", "demo", trigger="create") is None
    own = built.objects[("Service", "ns", "demo")]
    own["metadata"]["labels"] = {}
    kube.objects[("Service", "ns", "demo")] = own
    kube.refusals[("Deployment", "demo-stable")] = "denied by policy"
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.reason == "ChildRefused"
    assert _children(kube) == [("Service", "demo")]
    assert ("apply", "Service") in _child_writes(kube)
    assert ("create", "Service") in _child_writes(kube), "the stable track's, undone"


def test_an_undo_the_api_server_fails_leaves_the_service_its_own_children(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The refusal is what the user sees; what could not be deleted is logged and stays.

    The next reconcile is no longer a first: it dry-runs, is refused again and writes
    nothing; once the refusal is gone it completes the service on what was left.
    """
    kube, sync = _setup({"model": MODEL})
    kube.refusals[("Deployment", "demo-stable")] = "denied by policy"
    kube.unavailable.add(("delete", "Service"))
    with caplog.at_level(logging.WARNING):
        error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.reason == "ChildRefused"
    assert "a failed create left" in caplog.text
    assert _children(kube) == [("Service", "demo"), ("Service", "demo-stable")]
    degraded = kube.status_of("ns", "demo").condition(ConditionType.DEGRADED)
    assert degraded is not None
    assert degraded.reason == "ChildRefused"
    kube.writes.clear()
    again = sync.run_by_name("ns", "demo", trigger="resync")
    assert again is not None
    assert again.reason == "ChildRefused"
    assert _child_writes(kube) == []
    kube.refusals.clear()
    assert sync.run_by_name("ns", "demo", trigger="resync") is None
    assert _child_writes(kube) == [("create", "Deployment")]


def test_a_route_the_undo_cannot_delete_keeps_the_services_it_names() -> None:
    """The route's deletion fails: the Services stay, so no route names a missing one."""
    kube, sync = _setup({"model": MODEL, "traffic": GATEWAY})
    kube.refusals[("Deployment", "demo-stable")] = "denied by policy"
    kube.unavailable.add(("delete", "HTTPRoute"))
    sync.run_by_name("ns", "demo", trigger="create")
    assert _children(kube) == [
        ("HTTPRoute", "demo"),
        ("Service", "demo"),
        ("Service", "demo-stable"),
    ]
    assert [w for w in _child_writes(kube) if w[0] == "delete"] == []
