"""One reconcile against an in-memory cluster: apply, restore, report, and write nothing idle."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from fleetserve_operator import naming, render
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import MESSAGE_LIMIT, ClusterUnavailable
from fleetserve_operator.naming import Track
from fleetserve_operator.observe import (
    Observation,
    effective_canary_weight,
    memory_problem,
    reconcile_events,
    transitions,
)
from fleetserve_operator.records import EventNote, Manifest, MemoryFigures
from fleetserve_operator.spec import (
    Condition,
    ConditionType,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutPhase,
    TrackStatus,
)
from fleetserve_operator.testing import FakeKube, FakeMetricSource, make_service, make_spec

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def _setup(spec: dict[str, Any] | None = None, **kwargs: Any) -> tuple[FakeKube, Sync]:
    kube = FakeKube()
    kube.add_service(make_service(spec))
    sync = Sync(kube, metrics=OperatorMetrics(), clock=lambda: NOW, **kwargs)
    return kube, sync


def _conditions(kube: FakeKube) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in kube.status_of("ns", "demo").conditions}


def test_create_applies_children_and_reports_pending() -> None:
    """First reconcile: Deployment and Services created, phase Pending until pods are ready."""
    kube, sync = _setup()
    assert sync.run_by_name("ns", "demo", trigger="create") is None
    assert kube.created() == [
        ("Deployment", "demo-stable"),
        ("Service", "demo"),
        ("Service", "demo-stable"),
    ]
    assert kube.status_of("ns", "demo").phase == "Pending"
    assert _conditions(kube)["Ready"] == ("False", "Pending")
    (event,) = kube.events
    assert (event.type, event.reason) == ("Normal", "PhaseChanged"), "one Event per reconcile"
    (phase, progressing, *created) = event.message.split("; ")
    assert phase == "None -> Pending"
    assert progressing == "RollingUpdate: Progressing=True: rolling out: stable"
    assert sorted(created) == [
        "Created Deployment demo-stable",
        "Created Service demo",
        "Created Service demo-stable",
    ]


def test_a_new_service_gets_one_status_write_that_says_its_track_rolls_out() -> None:
    """The status written ahead of the children counts them as created: no second write."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    assert [w for w in kube.writes if w[0] == "status"] == [("status", "InferenceService", "demo")]
    assert kube.writes[0][0] == "status", "the status is still written ahead of the children"
    status = kube.status_of("ns", "demo")
    assert _conditions(kube)["Progressing"] == ("True", "RollingUpdate")
    assert status.ready == "0/1"


def test_a_canary_started_by_a_spec_change_gets_one_status_write() -> None:
    """The canary's Deployment and Service are written after the one status that names them."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    body = kube.objects[("InferenceService", "ns", "demo")]
    body["spec"]["batching"] = {"maxBatchSize": 8}
    body["metadata"]["generation"] += 1
    before = len(kube.writes)
    sync.run_by_name("ns", "demo", trigger="update")
    assert kube.writes[before:] == [
        ("status", "InferenceService", "demo"),
        ("create", "Deployment", "demo-canary"),
        ("create", "Service", "demo-canary"),
    ]
    assert kube.status_of("ns", "demo").tracks.canary is not None


def test_ready_pods_make_it_succeed_and_report_the_version() -> None:
    """When the Deployment is rolled out, status says Succeeded, stableVersion and 1/1."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    status = kube.status_of("ns", "demo")
    assert (status.phase, status.stable_version, status.ready) == ("Succeeded", "1", "1/1")
    assert _conditions(kube)["Ready"] == ("True", "Succeeded")
    assert _conditions(kube)["Progressing"] == ("False", "Complete")
    assert any(e.reason == "PhaseChanged" for e in kube.events)


def test_idle_reconcile_writes_nothing() -> None:
    """A converged service (as after an operator restart) gets no apply and no status write."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    before = list(kube.writes)
    sync.run_by_name("ns", "demo", trigger="resume")
    sync.run_by_name("ns", "demo", trigger="resync")
    assert kube.writes == before


def _parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the specs `Sync` parses (one entry per `InferenceServiceSpec.model_validate`)."""
    calls: list[int] = []
    parse = InferenceServiceSpec.model_validate

    def counted(raw: Any, **kwargs: Any) -> InferenceServiceSpec:
        calls.append(1)
        return parse(raw, **kwargs)

    monkeypatch.setattr(InferenceServiceSpec, "model_validate", counted)
    return calls


def test_an_unchanged_spec_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resyncs and child events of the same generation reuse the parsed spec."""
    kube, sync = _setup()
    parses = _parses(monkeypatch)
    sync.run_by_name("ns", "demo", trigger="create")
    kube.set_ready("demo-stable")
    for trigger in ("child", "resync", "resync"):
        sync.run_by_name("ns", "demo", trigger=trigger)
    assert len(parses) == 1


def test_a_changed_spec_is_parsed_again_even_at_the_same_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache compares the raw spec: a generation alone is not trusted."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    parses = _parses(monkeypatch)
    body = kube.objects[("InferenceService", "ns", "demo")]
    body["spec"]["batching"] = {"maxBatchSize": 8}
    before = len(kube.writes)
    sync.run_by_name("ns", "demo", trigger="resync")
    assert len(parses) == 1
    assert kube.writes[before:], "the new spec was acted on"


def _renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the renders of a service's children (`render.desired_children` calls)."""
    calls: list[int] = []
    desired = render.desired_children

    def counted(*args: Any, **kwargs: Any) -> list[Manifest]:
        calls.append(1)
        return desired(*args, **kwargs)

    monkeypatch.setattr(render, "desired_children", counted)
    return calls


def test_a_settled_service_renders_its_children_again_only_when_an_input_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Child events and resyncs of a settled service reuse the children last rendered.

    The reconcile after a status write renders once more: it renders from the status as
    reported, which the one before had not written yet.
    """
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    sync.run_by_name("ns", "demo", trigger="child")
    renders = _renders(monkeypatch)
    for trigger in ("child", "resync", "child"):
        sync.run_by_name("ns", "demo", trigger=trigger)
    assert renders == []
    kube.objects[("InferenceService", "ns", "demo")]["spec"]["batching"] = {"maxBatchSize": 8}
    before = len(kube.writes)
    sync.run_by_name("ns", "demo", trigger="update")
    assert renders == [1]
    assert ("create", "Deployment", "demo-canary") in kube.writes[before:], "rolled out"


def test_a_service_coming_up_renders_its_children_again_only_for_its_phase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ready counts and conditions reported on the way to Ready render nothing new.

    Only the part of the status rendering reads (`render.rendered_status`) is compared:
    one render with no status yet, one per phase reported (Pending, Succeeded), where
    comparing the whole status rendered again at every new ready count.
    """
    model = {"name": "demo", "version": "1", "uri": "builtin://synthetic"}
    kube, sync = _setup({"model": model, "runtime": {"replicas": {"min": 2, "max": 2}}})
    renders = _renders(monkeypatch)
    sync.run_by_name("ns", "demo", trigger="create")
    phases = [kube.status_of("ns", "demo").phase]
    for ready in (0, 1, 2):
        kube.set_ready("demo-stable", ready=ready)
        sync.run_by_name("ns", "demo", trigger="child")
        sync.run_by_name("ns", "demo", trigger="child")
        phases.append(kube.status_of("ns", "demo").phase)
    pending, succeeded = RolloutPhase.PENDING, RolloutPhase.SUCCEEDED
    assert phases == [pending, pending, pending, succeeded]
    assert kube.status_of("ns", "demo").ready == "2/2"
    assert len(renders) == 3


def test_deleted_child_is_restored() -> None:
    """A deleted Deployment comes back on the next reconcile."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    del kube.objects[("Deployment", "ns", "demo-stable")]
    sync.run_by_name("ns", "demo", trigger="child")
    assert ("Deployment", "ns", "demo-stable") in kube.objects


def test_edited_child_is_restored_but_foreign_fields_kept() -> None:
    """Drift in an owned field is re-applied; fields others own are not a drift."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    deployment = kube.objects[("Deployment", "ns", "demo-stable")]
    deployment["metadata"]["annotations"]["someone/else"] = "x"
    writes = len(kube.writes)
    sync.run_by_name("ns", "demo", trigger="child")
    assert len(kube.writes) == writes
    deployment["spec"]["template"]["spec"]["containers"][0]["args"][1] = "builtin://other"
    sync.run_by_name("ns", "demo", trigger="child")
    restored = kube.objects[("Deployment", "ns", "demo-stable")]
    assert restored["spec"]["template"]["spec"]["containers"][0]["args"][1] == "builtin://synthetic"


def test_a_field_dropped_from_the_spec_is_a_drift() -> None:
    """No hostnames any more: the HTTPRoute is applied without them."""
    gateway = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}]}
    spec = {"model": {"name": "m", "version": "1", "uri": "builtin://synthetic"},
            "traffic": {**gateway, "hostnames": ["a.example.com"]}}  # fmt: skip
    kube, sync = _setup(spec)
    sync.run_by_name("ns", "demo", trigger="create")
    kube.objects[("InferenceService", "ns", "demo")]["spec"]["traffic"] = gateway
    sync.run_by_name("ns", "demo", trigger="update")
    assert ("apply", "HTTPRoute", "demo") in kube.writes
    assert "hostnames" not in kube.objects[("HTTPRoute", "ns", "demo")]["spec"]


def test_disabling_the_fallback_deletes_it() -> None:
    """Children no longer desired are deleted."""
    spec = {"model": {"name": "m", "version": "1", "uri": "builtin://synthetic"},
            "fallback": {"enabled": True}}  # fmt: skip
    kube, sync = _setup(spec)
    sync.run_by_name("ns", "demo", trigger="create")
    assert ("Deployment", "ns", "demo-fallback") in kube.objects
    kube.objects[("InferenceService", "ns", "demo")]["spec"]["fallback"]["enabled"] = False
    sync.run_by_name("ns", "demo", trigger="update")
    assert ("Deployment", "ns", "demo-fallback") not in kube.objects
    assert ("delete", "Service", "demo-fallback") in kube.writes


def test_unknown_builtin_is_degraded_naming_the_field() -> None:
    """A semantic error: nothing applied, Degraded names spec.model.uri, phase Failed."""
    kube, sync = _setup({"model": {"name": "m", "version": "1", "uri": "builtin://gpt9"}})
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.field == "spec.model.uri"
    assert not [w for w in kube.writes if w[0] == "apply"]
    status = kube.status_of("ns", "demo")
    assert status.phase == "Failed"
    assert _conditions(kube)["Degraded"] == ("True", "InvalidSpec")
    assert status.last_error is not None
    assert "spec.model.uri" in status.last_error
    assert any(e.type == "Warning" for e in kube.events)


def test_missing_pvc_is_a_temporary_degradation() -> None:
    """A missing claim is DependencyMissing; creating it lets the next reconcile proceed."""
    kube, sync = _setup({"model": {"name": "m", "version": "1", "uri": "pvc://weights/enc"}})
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert error.reason == "DependencyMissing"
    assert _conditions(kube)["Degraded"] == ("True", "DependencyMissing")
    kube.claims.add(("ns", "weights"))
    assert sync.run_by_name("ns", "demo", trigger="resync") is None
    assert _conditions(kube)["Degraded"] == ("False", "AsExpected")


def test_memory_budget_check_reports_both_numbers() -> None:
    """Measured figures above the budget: Degraded MemoryBudgetExceeded with both numbers."""
    source = FakeMetricSource({
        "weights_bytes": 500e6, "fixed_bytes": 10e6, "bytes_per_token": 100_000,
    })  # fmt: skip
    spec = {"model": {"name": "m", "version": "1", "uri": "builtin://synthetic"},
            "memory": {"budget": "1Gi"}}  # fmt: skip
    kube, sync = _setup(spec, default_prometheus_url="http://prom:9090",
                        metric_source=lambda url: source)  # fmt: skip
    sync.run_by_name("ns", "demo", trigger="create")
    degraded = kube.status_of("ns", "demo").condition(ConditionType.DEGRADED)
    assert degraded is not None
    assert degraded.reason == "MemoryBudgetExceeded"
    assert "1329200000 bytes" in degraded.message
    assert "spec.memory.budget 1Gi" in degraded.message
    assert 'namespace="ns",model="m",version="1",track="stable"' in source.queries[0]


def test_memory_problem_none_within_budget() -> None:
    """A batch that fits raises no problem; no budget means no check."""
    figures = MemoryFigures(weights_bytes=1e6, fixed_bytes=1e6, bytes_per_token=10)
    assert memory_problem(make_spec(memory={"budget": "1Gi"}), figures) is None
    assert memory_problem(make_spec(), MemoryFigures(1e12, 0, 0)) is None


def test_condition_transition_time_kept_when_unchanged() -> None:
    """LastTransitionTime moves only when a condition's status flips."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    first = {c.type: c.last_transition_time for c in kube.status_of("ns", "demo").conditions}
    sync._clock = lambda: datetime(2025, 1, 1, 0, 5, tzinfo=UTC)  # later
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    later = {c.type: c.last_transition_time for c in kube.status_of("ns", "demo").conditions}
    assert later["Degraded"] == first["Degraded"]
    assert later["Ready"] == "2025-01-01T00:05:00Z"


def test_transitions_of_an_unchanged_status_are_empty() -> None:
    """No change, no Event."""
    status = InferenceServiceStatus(phase="Succeeded")
    assert transitions(status, status) == []


def test_a_reconciles_notes_are_one_event_and_each_warning_its_own() -> None:
    """The first Normal note's reason leads; a note's reason is kept in the message."""
    notes = [
        EventNote("Normal", "PhaseChanged", "Pending -> Succeeded"),
        EventNote("Warning", "ChildConflict", "Service demo is someone else's"),
        EventNote("Normal", "Succeeded", "Ready=True: stable track: 1/1 replicas available"),
        EventNote("Normal", "Updated", "Updated Service demo"),
        EventNote("Warning", "CrashLoopBackOff", "demo-stable restarts"),
    ]
    assert reconcile_events(notes) == [
        notes[1],
        notes[4],
        EventNote(
            "Normal",
            "PhaseChanged",
            "Pending -> Succeeded; Succeeded: Ready=True: stable track: 1/1 replicas available;"
            " Updated Service demo",
        ),
    ]
    assert reconcile_events(notes[1:2]) == notes[1:2]
    assert reconcile_events([]) == []


def test_notes_that_would_overflow_one_event_start_another() -> None:
    """An Event's message is cut at the limit: no note is lost to that, each stays whole."""
    long = [EventNote("Normal", "Created", f"Created Service {'x' * 400}-{i}") for i in range(5)]
    events = reconcile_events(long)
    assert [len(e.message.split("; ")) for e in events] == [2, 2, 1]
    assert all(len(e.message) <= MESSAGE_LIMIT for e in events)
    assert [part for e in events for part in e.message.split("; ")] == [n.message for n in long]


def test_a_reconcile_that_fails_part_way_posts_what_it_changed() -> None:
    """The status written ahead and the children created before the failure are news."""
    kube, sync = _setup()
    created: list[str] = []

    def fail_on_second_create() -> None:
        created.append(kube.writes[-1][2])
        if len(created) == 3:  # the status, then a child, then this one
            raise ClusterUnavailable("the API server went away")

    kube.on_write = fail_on_second_create
    with pytest.raises(ClusterUnavailable):
        sync.run_by_name("ns", "demo", trigger="create")
    (event,) = kube.events
    assert event.message.startswith("None -> Pending; ")
    assert event.message.count("Created ") == 1


def _degraded(reason: str) -> InferenceServiceStatus:
    condition = Condition(
        type=ConditionType.DEGRADED,
        status="True",
        reason=reason,
        last_transition_time="2025-01-01T00:00:00Z",
        message=f"{reason}!",
    )
    return InferenceServiceStatus(phase="Pending", conditions=[condition])


def test_a_new_failure_while_degraded_is_news() -> None:
    """Degraded stays True but its reason changes (ImagePullBackOff, then CrashLoopBackOff)."""
    notes = transitions(_degraded("ImagePullBackOff"), _degraded("CrashLoopBackOff"))
    assert [(n.type, n.reason) for n in notes] == [("Warning", "CrashLoopBackOff")]
    assert transitions(_degraded("CrashLoopBackOff"), _degraded("CrashLoopBackOff")) == []


def test_a_serving_service_stays_ready_with_a_problem() -> None:
    """Ready takes a problem's reason only while the stable track cannot serve."""
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    kube.add_pod("demo-stable", restarts=1, reason="Error")
    sync.run_by_name("ns", "demo", trigger="child")
    assert _conditions(kube)["Ready"] == ("True", "Succeeded")
    assert _conditions(kube)["Degraded"] == ("True", "CrashLoopBackOff")


def test_stale_body_does_not_repeat_the_last_report() -> None:
    """A body read before the last reconcile (kopf's may be) writes and posts nothing again."""
    kube, sync = _setup()
    stale = kube.get_inference_service("ns", "demo")
    assert stale is not None
    sync.run_by_name("ns", "demo", trigger="create")
    writes, events = list(kube.writes), list(kube.events)
    sync.run(stale, trigger="child")
    assert (kube.writes, kube.events) == (writes, events)


def test_a_deleted_service_is_not_reconciled() -> None:
    """An event that arrives after the InferenceService went writes nothing."""
    kube, sync = _setup()
    body = kube.get_inference_service("ns", "demo")
    assert body is not None
    del kube.objects[("InferenceService", "ns", "demo")]
    assert sync.run(body, trigger="child") is None
    assert kube.writes == []


@pytest.mark.parametrize("deleting", [False, True], ids=["serving", "deleting"])
def test_the_finalizer_kopf_left_is_taken_off_and_no_other(deleting: bool) -> None:
    """The one kopf put on services with a rollout timer: without kopf, their deletion hangs."""
    kube, sync = _setup()
    meta = kube.objects[(naming.KIND, "ns", "demo")]["metadata"]
    meta["finalizers"] = ["example.com/keep", naming.LEGACY_FINALIZER]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    sync.run_by_name("ns", "demo", trigger="resume")
    assert meta["finalizers"] == ["example.com/keep"]
    assert ("unfinalize", naming.KIND, "demo") in kube.writes
    assert any(action == "status" for action, _, _ in kube.writes) is not deleting
    writes = len(kube.writes)
    sync.run_by_name("ns", "demo", trigger="child")
    assert not any(action == "unfinalize" for action, _, _ in kube.writes[writes:])


def test_a_service_lock_lives_only_while_it_is_held() -> None:
    """Reconciles of one service share a lock while one holds it; none is kept afterwards."""
    kube, sync = _setup()
    held = sync._lock("ns", "demo")
    assert sync._lock("ns", "demo") is held
    assert sync._lock("ns", "other") is not held
    del held
    assert sync.run_by_name("ns", "demo", trigger="test") is None
    assert len(sync._locks) == 0


@pytest.mark.parametrize(
    ("split", "by_weight", "fallback", "canary", "stable", "expected", "alone"),
    [
        pytest.param(20, True, False, 1, 9, 20, False, id="route-weights-are-exact"),
        pytest.param(1, False, False, 1, 3, 25, False, id="replicas-one-next-to-three"),
        pytest.param(0, False, False, 1, 3, 25, False, id="starting-canary-already-served"),
        pytest.param(1, False, False, 1, 199, 1, False, id="a-served-canary-never-reads-0"),
        pytest.param(1, False, False, 0, 3, 0, False, id="no-ready-canary"),
        pytest.param(0, False, True, 1, 3, 0, False, id="fallback-serves"),
        pytest.param(100, False, False, 1, 3, 100, True, id="baking-standby-gets-nothing"),
        pytest.param(100, False, True, 1, 3, 0, True, id="baking-but-fallback-serves"),
    ],
)
def test_effective_canary_weight(
    split: int,
    by_weight: bool,
    fallback: bool,
    canary: int,
    stable: int,
    expected: int,
    alone: bool,
) -> None:
    """The route's weight with gateway-api; else the canary's share of ready GPU-pool pods.

    While the umbrella Service selects the canary alone (the bake's standby), all of it.
    """
    failover = Condition(
        type=ConditionType.FALLBACK_ACTIVE,
        status="True",
        last_transition_time="2025-01-01T00:00:00Z",
        reason="GPUTrackDown",
    )
    status = InferenceServiceStatus(
        # A split of 0 is a canary still Starting; any other is a step's weight.
        phase="Progressing" if split else "Starting",
        canary_weight=split,
        conditions=[failover] if fallback else [],
    )
    seen = Observation(
        generation=1,
        deployments={},
        problem=None,
        now="2025-01-01T00:00:00Z",
        routes_by_weight=by_weight,
        canary_only=alone,
    )
    tracks = {
        Track.CANARY: TrackStatus(ready_replicas=canary),
        Track.STABLE: TrackStatus(ready_replicas=stable),
    }
    assert effective_canary_weight(status, seen, tracks) == expected


@pytest.mark.parametrize(
    ("edit", "phase"),
    [
        ({"model": {"name": "demo", "version": "2", "uri": "builtin://synthetic"}}, "Starting"),
        ({"model": {"name": "demo", "version": "2", "uri": "builtin://gpt9"}}, "Failed"),
    ],
    ids=["valid", "invalid"],
)
def test_status_reports_the_generation_it_observed(edit: dict[str, Any], phase: str) -> None:
    """Every reconcile writes the generation it acted on, valid spec or not.

    `kubectl wait --for=jsonpath` and the e2e harness trust `observedGeneration` to tell a
    status about the current spec from one about the previous spec.
    """
    kube, sync = _setup()
    sync.run_by_name("ns", "demo", trigger="create")
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    assert kube.status_of("ns", "demo").observed_generation == 1
    body = kube.get_inference_service("ns", "demo")
    assert body is not None
    body["spec"] = edit
    body["metadata"]["generation"] = 2  # as the API server bumps it on a spec change
    kube.add_service(body)
    sync.run_by_name("ns", "demo", trigger="update")
    status = kube.status_of("ns", "demo")
    assert (status.phase, status.observed_generation) == (phase, 2)
    assert {c.type: c.observed_generation for c in status.conditions} == {
        c.type: 2 for c in status.conditions
    }
