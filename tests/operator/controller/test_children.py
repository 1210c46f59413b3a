"""Writing children safely: never another's object, nothing half built, status ahead of traffic."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleetserve_operator import naming
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.records import Manifest
from fleetserve_operator.spec import ConditionType
from fleetserve_operator.testing import FakeClock, FakeKube, FakeMetricSource, make_service

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}]}
MODEL = {"name": "demo", "version": "1", "uri": "builtin://synthetic"}


def _setup(**sections: Any) -> tuple[FakeKube, Sync]:
    kube = FakeKube()
    kube.add_service(make_service({"model": MODEL, **sections}))
    return kube, Sync(kube, metrics=OperatorMetrics())


def _condition(kube: FakeKube, kind: ConditionType) -> tuple[str, str, str]:
    condition = kube.status_of("ns", "demo").condition(kind)
    assert condition is not None
    return condition.status, condition.reason, condition.message


def _foreign(kube: FakeKube, kind: str, name: str, labels: dict[str, str]) -> Manifest:
    """Someone else's object, e.g. a Service another team created."""
    obj: Manifest = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "uid": "theirs", "labels": labels},
        "spec": {"selector": {"app": "billing"}, "ports": [{"port": 443}]},
    }
    kube.objects[(kind, "ns", name)] = obj
    return copy.deepcopy(obj)


def _writes(kube: FakeKube) -> list[tuple[str, str, str]]:
    return [write for write in kube.writes if write[1] != naming.KIND]


def _children(kube: FakeKube) -> list[tuple[str, str]]:
    """The operator's children stored (every object but the service and others' ones)."""
    return sorted(
        (kind, name)
        for (kind, _, name), obj in kube.objects.items()
        if kind != naming.KIND and obj["metadata"].get("uid") != "theirs"
    )


def test_an_object_it_does_not_control_is_left_untouched() -> None:
    """A Service named like the umbrella one: not written, nothing left built, Ready False.

    The first create, made without dry-runs, created the stable track's Service beside it
    and deletes it again; no Deployment was created, so no pod ever started.
    """
    kube, sync = _setup()
    before = _foreign(kube, "Service", "demo", {"app": "billing"})
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.reason == "ChildConflict"
    assert kube.objects[("Service", "ns", "demo")] == before
    assert _children(kube) == []
    assert _writes(kube) == [
        ("create", "Service", "demo-stable"),
        ("delete", "Service", "demo-stable"),
    ]
    ready = _condition(kube, ConditionType.READY)
    assert ready[:2] == ("False", "ChildConflict")
    assert "Service ns/demo already exists and is not controlled by this" in ready[2]
    assert _condition(kube, ConditionType.DEGRADED)[:2] == ("True", "ChildConflict")
    warnings = [e for e in kube.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["ChildConflict"]
    assert "Service ns/demo" in warnings[0].message


def test_our_labels_do_not_make_an_object_ours() -> None:
    """Only the controller reference counts: a copied label set is still someone else's."""
    kube, sync = _setup()
    labels = naming.labels("demo", naming.Track.STABLE)
    before = _foreign(kube, "Service", "demo-stable", labels)
    sync.run_by_name("ns", "demo", trigger="create")
    assert kube.objects[("Service", "ns", "demo-stable")] == before
    assert _writes(kube) == [], "an object labelled as its child: checked, not a first create"
    assert _condition(kube, ConditionType.DEGRADED)[:2] == ("True", "ChildConflict")


def test_the_conflict_clears_when_the_object_goes() -> None:
    """Once the other object is gone, the next reconcile builds every child."""
    kube, sync = _setup()
    _foreign(kube, "Service", "demo", {})
    sync.run_by_name("ns", "demo", trigger="create")
    del kube.objects[("Service", "ns", "demo")]
    kube.writes.clear()
    assert sync.run_by_name("ns", "demo", trigger="resync") is None
    created = sorted(name for action, _, name in _writes(kube) if action == "create")
    assert created == ["demo", "demo-stable", "demo-stable"]
    assert _condition(kube, ConditionType.DEGRADED)[:2] == ("False", "AsExpected")


def test_its_own_child_without_labels_is_applied_not_refused() -> None:
    """A child whose labels someone removed is still found by name, and put right."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    service = kube.objects[("Service", "ns", "demo")]
    service["metadata"]["labels"] = {}
    assert sync.run_by_name("ns", "demo", trigger="child") is None
    assert ("apply", "Service", "demo") in kube.writes
    assert kube.objects[("Service", "ns", "demo")]["metadata"]["labels"]


def test_a_refused_child_leaves_nothing_half_built() -> None:
    """The route is refused: no Deployment is created, the Services go again; status names it.

    The first create makes the Services before the routes and the Deployment last, without
    dry-runs; the route's refusal deletes the Services. A reconcile after that is no longer
    a first: it dry-runs, and writes nothing.
    """
    kube, sync = _setup(traffic=GATEWAY)
    kube.refusals[("HTTPRoute", "demo")] = 'spec.hostnames[0]: Invalid value: "Bad"'
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.reason == "ChildRefused"
    assert _children(kube) == []
    made = [(action, kind) for action, kind, _ in _writes(kube)]
    assert sorted(made) == [("create", "Service")] * 2 + [("delete", "Service")] * 2
    notes = " ".join(e.message for e in kube.events if e.type == "Normal")
    assert "Created Service demo-stable" in notes
    assert "Deleted Service demo-stable" in notes
    kube.writes.clear()
    again = sync.run_by_name("ns", "demo", trigger="resync")
    assert again is not None
    assert again.reason == "ChildRefused"
    assert _writes(kube) == []
    status, reason, message = _condition(kube, ConditionType.DEGRADED)
    assert (status, reason) == ("True", "ChildRefused")
    assert "HTTPRoute demo refused by the API server" in message
    assert 'spec.hostnames[0]: Invalid value: "Bad"' in message
    assert _condition(kube, ConditionType.READY)[:2] == ("False", "ChildRefused")
    assert kube.status_of("ns", "demo").phase == "Failed"


def test_a_refused_update_writes_no_other_child() -> None:
    """A new spec whose route is refused changes neither the Deployment nor the Services."""
    kube, sync = _setup(traffic=GATEWAY)
    sync.run_by_name("ns", "demo", trigger="create")
    objects = copy.deepcopy({k: v for k, v in kube.objects.items() if k[0] != naming.KIND})
    body = kube.objects[(naming.KIND, "ns", "demo")]
    body["spec"]["traffic"] = {**GATEWAY, "port": 8080, "hostnames": ["a.example"]}
    kube.refusals[("HTTPRoute", "demo")] = "denied by policy"
    sync.run_by_name("ns", "demo", trigger="update")
    assert {k: v for k, v in kube.objects.items() if k[0] != naming.KIND} == objects


def _rollout() -> tuple[FakeKube, Sync, FakeClock]:
    """Version 2 at its 20% step, judged on time alone (no analysis)."""
    kube = FakeKube()
    rollout = {"steps": [20, 50, 100], "interval": "10s"}
    kube.add_service(make_service({"model": MODEL, "traffic": GATEWAY, "rollout": rollout}))
    clock = FakeClock()
    sync = Sync(kube, metrics=OperatorMetrics(), clock=lambda: clock.now)
    sync.run_by_name("ns", "demo", trigger="create")
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    kube.objects[(naming.KIND, "ns", "demo")]["spec"]["model"] = {**MODEL, "version": "2"}
    sync.run_by_name("ns", "demo", trigger="update")
    kube.set_ready("demo-canary")
    sync.run_by_name("ns", "demo", trigger="child")
    assert kube.status_of("ns", "demo").canary_weight == 20
    return kube, sync, clock


def _canary_weight(kube: FakeKube) -> int:
    route = kube.objects[("HTTPRoute", "ns", "demo")]
    refs = route["spec"]["rules"][0]["backendRefs"]
    weight: int = next(ref["weight"] for ref in refs if ref["name"] == "demo-canary")
    return weight


def test_a_step_is_recorded_in_status_before_the_route_moves() -> None:
    """Write-ahead: the status write of the 50% step precedes the route's apply."""
    kube, sync, clock = _rollout()
    kube.writes.clear()
    clock.advance(10)
    sync.run_by_name("ns", "demo", trigger="rollout")
    assert _canary_weight(kube) == 50
    route = kube.writes.index(("apply", "HTTPRoute", "demo"))
    assert ("status", naming.KIND, "demo") in kube.writes[:route]


def test_a_route_behind_status_is_moved_forward_not_back() -> None:
    """Stopped between the two writes: status says 50%, the route still 20%.

    With the analysis inconclusive (Prometheus down) the next operator holds 50% and moves
    the route up to it.
    """
    kube, sync, clock = _rollout()
    route = copy.deepcopy(kube.objects[("HTTPRoute", "ns", "demo")])
    clock.advance(10)
    sync.run_by_name("ns", "demo", trigger="rollout")
    kube.objects[("HTTPRoute", "ns", "demo")] = route
    assert _canary_weight(kube) == 20
    body = kube.objects[(naming.KIND, "ns", "demo")]
    body["spec"]["rollout"]["analysis"] = {"prometheusUrl": "http://prometheus:9090"}
    down = FakeMetricSource(online=False)
    restarted = Sync(kube, metrics=OperatorMetrics(), clock=lambda: clock.now,
                     metric_source=lambda url: down)  # fmt: skip
    clock.advance(10)
    restarted.run_by_name("ns", "demo", trigger="resume")
    assert kube.status_of("ns", "demo").canary_weight == 50
    assert _canary_weight(kube) == 50


class _CountingKube(FakeKube):
    """`FakeKube` that counts reads of single children by name."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get_child(self, manifest: Manifest) -> Manifest | None:
        """Counted."""
        self.reads += 1
        return super().get_child(manifest)


def test_creating_a_service_reads_none_of_its_children_by_name() -> None:
    """The create's dry-run answers whether a name is taken: no GET before every create."""
    kube = _CountingKube()
    kube.add_service(make_service({"model": MODEL}))
    assert Sync(kube, metrics=OperatorMetrics()).run_by_name("ns", "demo", trigger="create") is None
    assert {kind for action, kind, _ in kube.writes if action == "create"} == {
        "Deployment",
        "Service",
    }
    assert kube.reads == 0


@pytest.mark.parametrize("first", [True, False], ids=["first-create", "checked"])
def test_a_refused_create_onto_anothers_object_is_a_conflict(first: bool) -> None:
    """A create (or its dry-run) refused where their Service holds the name: it is theirs.

    The refusal (a quota's, say) comes before the API server looks at the name, and would
    hide it; the name is looked up. `first`: the service's first create, unchecked; else
    a later one (a status was written), dry-run first.
    """
    kube, sync = _setup()
    if not first:
        kube.objects[(naming.KIND, "ns", "demo")]["status"] = {"phase": "Pending"}
    before = _foreign(kube, "Service", "demo", {"app": "billing"})
    kube.refusals[("Service", "demo")] = "spec.ports[0].name: Required value"
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.reason == "ChildConflict"
    assert kube.objects[("Service", "ns", "demo")] == before
    assert _children(kube) == []
    assert not any(kind == "Deployment" for _, kind, _ in _writes(kube))
    if not first:
        assert _writes(kube) == []
