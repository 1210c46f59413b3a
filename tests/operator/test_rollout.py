"""The rollout state machine, stepped with a FakeClock, scripted metrics and simulated tracks.

The world renders the children from every status `next_step` returns, as `sync` does
(`render.desired_children`), and plays the Deployment controller on what it rendered;
the tests assert on the status and on those rendered children.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from fleetserve_operator import analysis, naming, render, rollout
from fleetserve_operator.analysis import (
    REJECTIONS,
    SERVER_ERRORS,
)
from fleetserve_operator.contract import QUEUE_WAIT_METRIC, REQUEST_DURATION_METRIC
from fleetserve_operator.naming import Track
from fleetserve_operator.records import EventNote, Manifest, rfc3339
from fleetserve_operator.render import Owner
from fleetserve_operator.rollout import (
    ClearAnnotation,
    Facts,
    IncrementCounter,
    OperatorCounter,
    TrackFacts,
    Transition,
)
from fleetserve_operator.spec import (
    ConditionType,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutCommand,
    RolloutPhase,
)
from fleetserve_operator.testing import FakeClock, ScriptedMetricSource, make_spec

ANALYSIS = {"prometheusUrl": "http://prometheus:9090", "minRequests": 20}
# An HTTPRoute carries the exact weights, so the rendered children show every split.
TRAFFIC = {"provider": "gateway-api", "parentRefs": [{"name": "gateway"}]}
OWNER = Owner(name="demo", namespace="ns", uid="uid-demo")
HEALTHY: dict[str, float | None] = {"requests": 500, "errors": 0.0, "p99": 50, "queue": 5}


def make_rollout_spec(version: str = "1", **rollout_knobs: Any) -> InferenceServiceSpec:
    """A spec with 2 stable replicas, a 60 s interval, analysis and a CPU fallback."""
    knobs = {"interval": "60s", "progressDeadline": "5m", "analysis": ANALYSIS} | rollout_knobs
    return make_spec(
        model={"name": "demo", "version": version, "uri": "builtin://synthetic"},
        runtime={"replicas": {"min": 2, "max": 2}},
        rollout=knobs,
        fallback={"enabled": True, "maxErrorRate": 0.5},
        traffic=TRAFFIC,
    )


@dataclass(frozen=True, slots=True)
class Template:
    """A GPU track's Deployment rendered with a new pod template (a rolling update)."""

    track: Track
    version: str
    spec_hash: str


@dataclass
class World:
    """The cluster as `sync` would leave it: children rendered from each status, actions applied.

    `stable`/`canary` are the observed tracks: a newly rendered template rolls out at once
    (the canary's only when `canary_becomes_ready`); a test may change what is observed,
    and that holds until the track's template changes. `routes` (HTTPRoute weights),
    `scales` (stable and canary replicas) and `templates` record every rendered change.
    """

    spec: InferenceServiceSpec
    knobs: dict[str, Any] = field(default_factory=dict)
    clock: FakeClock = field(default_factory=FakeClock)
    status: InferenceServiceStatus = field(default_factory=InferenceServiceStatus)
    stable: TrackFacts | None = None
    canary: TrackFacts | None = None
    canary_becomes_ready: bool = True
    metrics: dict[str, float | None] = field(default_factory=lambda: dict(HEALTHY))
    prometheus_online: bool = True
    annotations: dict[str, str] = field(default_factory=dict)
    actions: list[rollout.Action] = field(default_factory=list)
    routes: list[dict[Track, int]] = field(default_factory=list)
    scales: list[tuple[int | None, int]] = field(default_factory=list)
    templates: list[Template] = field(default_factory=list)

    def source(self) -> ScriptedMetricSource:
        """Scripted Prometheus answers for the current canary and stable series."""
        target = self.target()
        c, s, w, m = target.canary, target.stable, target.window, self.metrics
        return ScriptedMetricSource(
            values={
                analysis.requests_query(c, w): m["requests"],
                analysis.code_ratio_query(c, w, SERVER_ERRORS): m["errors"],
                analysis.p99_ms_query(REQUEST_DURATION_METRIC, c, w): m["p99"],
                analysis.p99_ms_query(REQUEST_DURATION_METRIC, s, w): HEALTHY["p99"],
                analysis.p99_ms_query(QUEUE_WAIT_METRIC, c, w): m["queue"],
                analysis.p99_ms_query(QUEUE_WAIT_METRIC, s, w): HEALTHY["queue"],
                analysis.code_ratio_query(c, w, REJECTIONS): 0.0,
                analysis.code_ratio_query(s, w, REJECTIONS): 0.0,
            },
            online=self.prometheus_online,
        )

    def facts(self) -> Facts:
        """What the caller observes now, with the analysis run only when it is due."""
        result = None
        config = self.spec.rollout.analysis
        if config is not None and rollout.is_analysis_due(self.spec, self.status, self.clock.now):
            result = analysis.evaluate(self.source(), config, self.target())
        return Facts(
            stable=self.stable,
            canary=self.canary,
            annotations=dict(self.annotations),
            analysis=result,
        )

    def target(self) -> analysis.AnalysisTarget:
        """The series the analysis compares."""
        return analysis.target_for(self.spec, self.status, namespace="ns")

    def tick(self, seconds: float = 0) -> Transition:
        """Advance the clock, run `next_step`, render its status and apply its actions."""
        self.clock.advance(seconds)
        transition = rollout.next_step(self.spec, self.status, self.facts(), self.clock.now)
        self.status = transition.status
        self.render()
        for action in transition.actions:
            self.actions.append(action)
            if isinstance(action, ClearAnnotation):
                self.annotations.pop(action.annotation, None)
        return transition

    def children(self, status: InferenceServiceStatus) -> list[Manifest]:
        """The children `sync` renders for `status`."""
        observed = self.stable.replicas if self.stable else 0
        return render.desired_children(OWNER, self.spec, status, observed_stable_replicas=observed)

    def render(self) -> None:
        """Render the children of the current status and play the Deployment controller."""
        children = self.children(self.status)
        route = route_weights(children)
        if not self.routes or self.routes[-1] != route:
            self.routes.append(route)
        deployments = {
            child["metadata"]["labels"][naming.TRACK_LABEL]: child
            for child in children
            if child["kind"] == "Deployment"
        }
        self.stable = self.observe(deployments.get(Track.STABLE), self.stable, ready=True)
        self.canary = self.observe(
            deployments.get(Track.CANARY), self.canary, ready=self.canary_becomes_ready
        )
        scale = (
            self.stable.replicas if self.stable else None,
            self.canary.replicas if self.canary else 0,
        )
        if not self.scales or self.scales[-1] != scale:
            self.scales.append(scale)

    def observe(
        self, deployment: Manifest | None, seen: TrackFacts | None, *, ready: bool
    ) -> TrackFacts | None:
        """What the Deployment controller makes of a rendered track Deployment."""
        if deployment is None:
            return None
        labels = deployment["metadata"]["labels"]
        spec_hash = labels[naming.SPEC_HASH_LABEL]
        replicas = deployment["spec"]["replicas"]
        if seen is not None and seen.spec_hash == spec_hash:
            return replace(seen, replicas=replicas)
        track = Track(labels[naming.TRACK_LABEL])
        self.templates.append(Template(track, labels[naming.MODEL_VERSION_LABEL], spec_hash))
        available = replicas if ready else 0
        return TrackFacts(spec_hash, available=available, replicas=replicas, rolled_out=ready)

    def of(self, kind: type[Any]) -> list[Any]:
        """The actions of one kind applied so far."""
        return [a for a in self.actions if isinstance(a, kind)]

    def rolled(self, track: Track) -> list[Template]:
        """The templates rendered for `track` so far."""
        return [template for template in self.templates if template.track is track]

    def clear(self) -> None:
        """Forget what was applied and rendered so far, keeping the current state as the base."""
        self.actions.clear()
        self.templates.clear()
        del self.routes[:-1]
        del self.scales[:-1]


def route_weights(children: list[Manifest]) -> dict[Track, int]:
    """The HTTPRoute's weight per track, as rendered."""
    (route,) = [child for child in children if child["kind"] == "HTTPRoute"]
    backends = route["spec"]["rules"][0]["backendRefs"]
    by_name = {naming.child_name(OWNER.name, track): track for track in Track}
    return {by_name[backend["name"]]: backend["weight"] for backend in backends}


def stable_world(**rollout_knobs: Any) -> World:
    """Version 1 deployed and serving (adopted, stable Ready, phase Succeeded)."""
    world = World(make_rollout_spec("1", **rollout_knobs), knobs=rollout_knobs)
    world.tick()
    world.tick()
    assert (world.status.phase, world.status.stable_version) == ("Succeeded", "1")
    world.clear()
    return world


def start_v2(world: World, version: str = "2") -> None:
    """Change the spec to `version`, then let the canary become Ready (at the first step)."""
    world.spec = make_rollout_spec(version, **world.knobs)
    world.tick()
    assert world.status.phase == "Starting"
    world.tick()


def changed(track: TrackFacts | None, **changes: Any) -> TrackFacts:
    """An observed track with some facts changed."""
    assert track is not None
    return replace(track, **changes)


def weights(world: World) -> list[int]:
    """The canary weights the HTTPRoute was rendered with since the base, in order."""
    return [route.get(Track.CANARY, 0) for route in world.routes[1:]]


def test_first_deploy_is_adopted_without_a_canary() -> None:
    """A new service rolls its spec straight onto the stable track: Pending, then Succeeded."""
    world = World(make_rollout_spec("1"))
    first = world.tick()
    assert first.trigger == "Adopt"
    assert world.status.phase == "Pending"
    digest = world.spec.gpu_track.digest
    assert world.rolled(Track.STABLE) == [Template(Track.STABLE, "1", digest)]
    assert world.tick().trigger == "StableAvailable"
    assert world.status.phase == "Succeeded"
    assert world.rolled(Track.CANARY) == []
    assert world.canary is None


def test_healthy_canary_is_promoted_through_every_step() -> None:
    """1 → 5 → 20 → 50 → 100, then stable moves to v2, traffic returns, canary goes."""
    world = stable_world()
    start_v2(world)
    assert (world.status.phase, world.status.canary_weight) == ("Progressing", 1)
    for _ in range(5):
        world.tick(60)
    assert world.status.phase == "Promoting"
    assert world.rolled(Track.STABLE) == [Template(Track.STABLE, "2", world.spec.gpu_track.digest)]
    world.tick()
    assert (world.status.phase, world.status.stable_version) == ("Succeeded", "2")
    # Starting lists the canary at 0 until it is Ready; afterwards the route has no canary.
    assert weights(world) == [0, 1, 5, 20, 50, 100, 0]
    assert world.canary is None
    assert world.of(IncrementCounter) == [IncrementCounter(OperatorCounter.PROMOTIONS, "Promoted")]
    assert [a.verdict for a in world.status.rollout.analyses] == ["Passed"] * 5
    promoted = world.status.condition(ConditionType.PROMOTED)
    assert promoted is not None
    assert (promoted.status, promoted.reason) == ("True", "Succeeded")


@pytest.mark.parametrize(
    ("bad", "failing_check"),
    [
        pytest.param({"errors": 0.2}, "error-rate", id="error-spike"),
        pytest.param({"p99": 150}, "p99-latency-vs-stable", id="latency-only"),
    ],
)
def test_regression_at_20_percent_rolls_back(bad: dict[str, float], failing_check: str) -> None:
    """Two failed analyses at 20% (failureThreshold 2): weight 0 at once, canary removed."""
    world = stable_world()
    start_v2(world)
    world.tick(60)
    world.tick(60)
    assert world.status.canary_weight == 20
    world.metrics |= bad
    world.tick(60)
    assert (world.status.phase, world.status.rollout.failed_analyses) == ("Progressing", 1)
    world.tick(60)
    assert world.status.phase == "RolledBack"
    assert weights(world)[-1] == 0
    assert world.canary is None
    assert world.of(IncrementCounter) == [
        IncrementCounter(OperatorCounter.ROLLBACKS, "AnalysisFailed")
    ]
    message = world.status.rollout.message
    assert failing_check in message
    assert "at 20%" in message
    assert world.spec.model.version == "2"  # the spec is never rewritten
    assert world.status.stable_version == "1"
    world.tick(600)
    assert world.status.phase == "RolledBack"  # not retried by itself


@pytest.mark.parametrize(
    "outage",
    [
        pytest.param({"requests": 3}, id="too-little-traffic"),
        pytest.param({"prometheus_online": False}, id="prometheus-down"),
    ],
)
def test_no_data_holds_and_never_promotes(outage: dict[str, Any]) -> None:
    """Inconclusive analyses never pass; after 3 the rollout holds at its weight, then resumes."""
    world = stable_world()
    start_v2(world)
    if "requests" in outage:
        world.metrics |= outage
    else:
        world.prometheus_online = False
    for _ in range(10):
        world.tick(60)
    assert (world.status.phase, world.status.canary_weight) == ("Holding", 1)
    assert "never promoting without data" in world.status.rollout.message
    assert {a.verdict for a in world.status.rollout.analyses} == {"Inconclusive"}
    assert world.rolled(Track.STABLE) == []
    world.metrics = dict(HEALTHY)
    world.prometheus_online = True
    world.tick(60)
    assert (world.status.phase, world.status.canary_weight) == ("Progressing", 5)


@pytest.mark.parametrize(
    ("command", "value", "phase", "weight"),
    [
        pytest.param(RolloutCommand.PROMOTE, "next", "Progressing", 5, id="promote-next"),
        pytest.param(RolloutCommand.PROMOTE, "full", "Promoting", 100, id="promote-full"),
        pytest.param(RolloutCommand.PAUSE, "true", "Paused", 1, id="pause"),
        pytest.param(RolloutCommand.ABORT, "true", "RolledBack", 0, id="abort"),
    ],
)
def test_manual_commands_are_acted_on_once_and_acknowledged(
    command: RolloutCommand, value: str, phase: str, weight: int
) -> None:
    """Each annotation moves the rollout once, is acknowledged in status, then removed."""
    world = stable_world()
    start_v2(world)
    world.annotations[command.annotation] = value
    world.tick()
    assert (world.status.phase, world.status.canary_weight) == (phase, weight)
    ack = world.status.rollout.acknowledged[-1]
    assert (ack.annotation, ack.value) == (command.annotation, value)
    assert ClearAnnotation(command.annotation) in world.actions
    assert any(
        isinstance(a, EventNote) and a.reason == "CommandAcknowledged" for a in world.actions
    )
    assert weights(world)[-1] == weight
    world.tick()
    assert world.status.rollout.acknowledged == []


def test_pause_holds_through_passing_analyses_until_resume() -> None:
    """Paused: analyses are recorded but do not advance; resume continues from there."""
    world = stable_world()
    start_v2(world)
    world.annotations[RolloutCommand.PAUSE.annotation] = "1"
    world.tick()
    for _ in range(3):
        world.tick(60)
    assert (world.status.phase, world.status.canary_weight) == ("Paused", 1)
    assert len(world.status.rollout.analyses) == 3
    world.annotations[RolloutCommand.RESUME.annotation] = "1"
    world.tick()
    assert world.status.phase == "Progressing"
    world.tick(60)
    assert world.status.canary_weight == 5


def test_paused_canary_still_rolls_back_on_failures() -> None:
    """Pausing never pauses safety: failed analyses still roll the canary back."""
    world = stable_world()
    start_v2(world)
    world.annotations[RolloutCommand.PAUSE.annotation] = "1"
    world.tick()
    world.metrics["errors"] = 0.5
    world.tick(60)
    world.tick(60)
    assert world.status.phase == "RolledBack"


def test_command_without_a_row_is_acknowledged_as_ignored() -> None:
    """Promoting a service with no rollout changes nothing, and says so."""
    world = stable_world()
    world.annotations[RolloutCommand.PROMOTE.annotation] = "next"
    world.tick()
    assert world.status.phase == "Succeeded"
    assert world.status.rollout.acknowledged[-1].result == "ignored in phase Succeeded"


def test_restart_mid_step_resumes_the_same_step() -> None:
    """A status written and read back (operator restart) yields the same step, no actions."""
    world = stable_world()
    start_v2(world)
    world.tick(60)
    world.tick(30)
    stored = world.status.model_dump(by_alias=True, exclude_none=True, mode="json")
    restarted = InferenceServiceStatus.model_validate(stored)
    facts = world.facts()
    first = rollout.next_step(world.spec, restarted, facts, world.clock.now)
    again = rollout.next_step(world.spec, first.status, facts, world.clock.now)
    assert (first.status, first.actions, first.trigger) == (restarted, (), None)
    assert (again.status, again.actions) == (restarted, ())
    assert (restarted.phase, restarted.canary_weight) == ("Progressing", 5)


def test_restart_while_promoting_never_promotes_twice() -> None:
    """Promoting with the stable not yet rolled out: repeated calls render no second promotion."""
    world = stable_world()
    start_v2(world)
    world.annotations[RolloutCommand.PROMOTE.annotation] = "full"
    world.tick()
    world.stable = changed(world.stable, rolled_out=False)
    promoted = world.rolled(Track.STABLE)
    assert [template.version for template in promoted] == ["2"]
    for _ in range(3):
        world.tick(30)
    assert world.status.phase == "Promoting"
    assert world.rolled(Track.STABLE) == promoted
    assert not world.of(IncrementCounter)


def test_fallback_on_and_off_and_no_advance_while_active() -> None:
    """No stable replica: traffic to the CPU fallback, rollout frozen; back when healthy."""
    world = stable_world()
    start_v2(world)
    world.stable = changed(world.stable, available=0)
    world.canary = changed(world.canary, available=0)
    world.tick()
    assert world.routes[-1] == {Track.STABLE: 0, Track.CANARY: 0, Track.FALLBACK: 100}
    assert not rollout.is_analysis_due(world.spec, world.status, world.clock.advance(600))
    world.tick()
    assert world.status.canary_weight == 1
    world.stable = changed(world.stable, available=2)
    world.canary = changed(world.canary, available=1)
    world.tick()
    assert world.routes[-1] == {Track.STABLE: 99, Track.CANARY: 1, Track.FALLBACK: 0}
    world.tick(30)
    assert world.status.canary_weight == 1  # a fresh interval after the failover
    world.tick(30)
    assert world.status.canary_weight == 5


def test_fallback_on_stable_error_ratio() -> None:
    """A stable 5xx ratio above fallback.maxErrorRate fails over too."""
    world = stable_world()
    facts = Facts(stable=world.stable, stable_error_ratio=0.9)
    transition = rollout.next_step(world.spec, world.status, facts, world.clock.now)
    routed = route_weights(world.children(transition.status))
    assert routed == {Track.STABLE: 0, Track.FALLBACK: 100}
    condition = transition.status.conditions[0]
    assert (condition.type, condition.status, condition.reason) == (
        "FallbackActive",
        "True",
        "StableErrorRate",
    )


def test_new_spec_during_a_rollout_restarts_with_the_newest_version() -> None:
    """v3 arrives while v2 is at 5%: the canary is re-templated to v3 at weight 0."""
    world = stable_world()
    start_v2(world)
    world.tick(60)
    world.spec = make_rollout_spec("3")
    transition = world.tick()
    assert transition.trigger == "NewSpec"
    assert (world.status.phase, world.status.canary_version, world.status.canary_weight) == (
        "Starting",
        "3",
        0,
    )
    assert world.rolled(Track.CANARY)[-1].version == "3"
    world.tick()
    assert world.status.canary_weight == 1


def test_canary_never_ready_fails_the_rollout() -> None:
    """Weight stays 0 until Ready; past progressDeadline the rollout is Failed."""
    world = stable_world()
    world.canary_becomes_ready = False
    world.spec = make_rollout_spec("2")
    world.tick()
    world.tick(240)
    assert (world.status.phase, world.status.canary_weight) == ("Starting", 0)
    world.tick(60)
    assert world.status.phase == "Failed"
    assert "CanaryNotReady" in world.status.rollout.message
    assert world.canary is None


@pytest.mark.parametrize(
    ("crash", "reason"),
    [
        pytest.param({"oom_killed": True, "restarts": 1}, "CanaryOOMKilled", id="oom"),
        pytest.param({"restarts": 2}, "CanaryRestarted", id="restart"),
    ],
)
def test_canary_crash_fails_at_once(crash: dict[str, Any], reason: str) -> None:
    """An OOM kill or a restart during a step rolls back without waiting for the interval."""
    world = stable_world()
    start_v2(world)
    world.canary = changed(world.canary, **crash)
    world.tick()
    assert world.status.phase == "RolledBack"
    assert world.of(IncrementCounter) == [IncrementCounter(OperatorCounter.ROLLBACKS, reason)]


def test_retry_annotation_and_revert_after_a_rollback() -> None:
    """`retry` rolls the same spec out again; reverting the spec settles back to Succeeded."""
    world = stable_world()
    start_v2(world)
    world.annotations[RolloutCommand.ABORT.annotation] = "now"
    world.tick()
    world.tick()
    assert world.status.phase == "RolledBack"
    world.annotations[RolloutCommand.RETRY.annotation] = "1"
    world.tick()
    assert (world.status.phase, world.status.canary_version) == ("Starting", "2")
    world.annotations[RolloutCommand.ABORT.annotation] = "again"
    world.tick()
    world.spec = make_rollout_spec("1")
    world.tick()
    assert (world.status.phase, world.status.rollout.spec_hash) == ("Succeeded", None)


@pytest.mark.parametrize(
    ("replicas", "gpus", "surge", "weight", "expected"),
    [
        pytest.param(4, 1, None, 20, (4, 1), id="no-bound"),
        pytest.param(4, 1, 1, 1, (4, 1), id="surge-1-at-1%"),
        pytest.param(4, 1, 1, 50, (3, 2), id="surge-1-at-50%"),
        pytest.param(4, 1, 1, 100, (1, 4), id="surge-1-at-100%"),
        pytest.param(4, 2, 2, 50, (3, 2), id="two-gpus-per-replica"),
        pytest.param(4, 1, 0, 1, (4, 1), id="bound-too-tight-for-own-weight"),
        pytest.param(10, 1, 2, 20, (10, 2), id="ceil-weight"),
        pytest.param(4, 0, 0, 50, (4, 2), id="cpu-only-ignores-bound"),
    ],
)
def test_gpu_aware_capacity(
    replicas: int, gpus: int, surge: int | None, weight: int, expected: tuple[int, int]
) -> None:
    """Canary = ceil(weight x stable), >= 1; maxSurgeGPUs shrinks stable, never below its share."""
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    spec = make_spec(
        runtime={"replicas": {"min": replicas, "max": replicas}, "resources": {"limits": limits}},
        rollout={"maxSurgeGPUs": surge} if surge is not None else {},
    )
    status = InferenceServiceStatus(phase="Progressing", canary_weight=weight)
    plan = rollout.plan_capacity(spec, status, stable_replicas=replicas)
    assert (plan.stable, plan.canary) == expected


def test_rendered_replicas_follow_the_weight() -> None:
    """The canary starts with one replica and grows to the stable size at 100%; then goes."""
    world = stable_world()
    start_v2(world)
    for _ in range(5):
        world.tick(60)
    assert world.scales[1:] == [(2, 1), (2, 2)]
    world.tick()
    assert world.scales[-1] == (2, 0)


@pytest.mark.parametrize("phase", list(RolloutPhase))
def test_a_refused_spec_fails_the_rollout_in_every_phase(phase: RolloutPhase) -> None:
    """The table decides `Failed` for an invalid spec; rollout state and traffic are kept.

    A fallback that is active stays active although the tracks look healthy: a refused
    spec says nothing about them.
    """
    world = stable_world()
    start_v2(world)
    world.tick(60)
    world.stable = changed(world.stable, available=0)
    world.canary = changed(world.canary, available=0)
    world.tick()
    assert rollout.fallback_active(world.status)
    world.stable = changed(world.stable, available=2)
    world.canary = changed(world.canary, available=1)
    status = world.status.model_copy(update={"phase": phase})
    transition = rollout.next_step(None, status, world.facts(), world.clock.advance(600))
    assert (transition.trigger, transition.status.phase) == ("SpecInvalid", "Failed")
    kept = ("rollout", "canary_version", "canary_weight", "stable_version")
    assert transition.status.model_dump(include=set(kept)) == status.model_dump(include=set(kept))
    assert rollout.fallback_active(transition.status)


def _capacity(
    phase: str,
    weight: int,
    *,
    replicas: dict[str, int],
    observed: int,
    gpus: int = 1,
    surge: int | None = None,
) -> tuple[int | None, int]:
    """`plan_capacity` for a spec with these replica bounds, GPUs and surge bound."""
    spec = make_spec(
        runtime={"replicas": replicas, "resources": {"limits": {"nvidia.com/gpu": gpus}}},
        rollout={"maxSurgeGPUs": surge} if surge is not None else {},
    )
    status = InferenceServiceStatus(phase=phase, canary_weight=weight)
    plan = rollout.plan_capacity(spec, status, stable_replicas=observed)
    return plan.stable, plan.canary


@pytest.mark.parametrize(
    ("phase", "weight", "replicas", "observed", "surge", "expected"),
    [
        pytest.param("Progressing", 50, {"min": 2, "max": 10}, 6, None, (None, 3),
                     id="autoscaled-canary-follows-observed-stable"),
        pytest.param("Progressing", 50, {"min": 2, "max": 10}, 6, 1, (None, 3),
                     id="autoscaled-ignores-surge-bound"),
        pytest.param("Promoting", 100, {"min": 2, "max": 10}, 7, None, (None, 7),
                     id="autoscaled-promoting"),
        pytest.param("Promoting", 100, {"min": 4, "max": 4}, 4, 1, (4, 4),
                     id="promoting-keeps-stable-full-despite-surge"),
        pytest.param("Promoting", 20, {"min": 4, "max": 4}, 4, None, (4, 4),
                     id="promoting-canary-full-whatever-the-recorded-weight"),
        pytest.param("Succeeded", 0, {"min": 3, "max": 3}, 3, 1, (3, 0), id="no-rollout"),
        pytest.param("Succeeded", 0, {"min": 2, "max": 10}, 5, None, (None, 0),
                     id="no-rollout-autoscaled"),
    ],
)  # fmt: skip
def test_capacity_by_phase_and_autoscaling(
    phase: str,
    weight: int,
    replicas: dict[str, int],
    observed: int,
    surge: int | None,
    expected: tuple[int | None, int],
) -> None:
    """Track sizes by phase, with and without an autoscaler.

    An autoscaled stable is left to its autoscaler (None) and sizes the canary from the
    observed count; promotion gives the canary the full size and keeps the stable full; with
    no rollout the canary has no replica.
    """
    got = _capacity(phase, weight, replicas=replicas, observed=observed, surge=surge)
    assert got == expected


@pytest.mark.parametrize(
    ("replicas", "gpus", "surge", "weight", "expected"),
    [
        pytest.param(4, 1, 0, 50, (2, 2), id="own-share-exact-under-zero-surge"),
        pytest.param(4, 2, 3, 50, (3, 2), id="surge-not-a-multiple-of-gpus"),
        pytest.param(101, 1, 0, 1, (100, 2), id="large-fleet-rounds-up-both-shares"),
        pytest.param(200, 1, None, 51, (200, 102), id="large-fleet-canary-ceil"),
    ],
)
def test_surge_bound_rounding(
    replicas: int, gpus: int, surge: int | None, weight: int, expected: tuple[int, int]
) -> None:
    """Whole replicas under a surge bound.

    The canary is ceil(weight x size), the stable keeps ceil of its own share, and
    `maxSurgeGPUs` is counted in whole replicas of `gpus` GPUs each.
    """
    exact = {"min": replicas, "max": replicas}
    got = _capacity(
        "Progressing", weight, replicas=exact, observed=replicas, gpus=gpus, surge=surge
    )
    assert got == expected
    assert all(isinstance(n, int) for n in got)


def test_a_refused_spec_leaves_no_canary_traffic_or_replicas() -> None:
    """Failed keeps the last canary weight in status, but routes nothing and runs no canary."""
    world = stable_world()
    start_v2(world)
    world.tick(60)
    failed = rollout.next_step(None, world.status, world.facts(), world.clock.now).status
    assert (failed.phase, failed.canary_weight) == ("Failed", 5)
    split = rollout.traffic_split(failed)
    assert (split.stable, split.canary, split.fallback) == (100, 0, 0)
    plan = rollout.plan_capacity(world.spec, failed, stable_replicas=2)
    assert (plan.stable, plan.canary) == (2, 0)


def events(world: World) -> list[tuple[str, str, str]]:
    """The Events posted so far, as (type, reason, message)."""
    return [(e.type, e.reason, e.message) for e in world.of(EventNote)]


def test_each_move_posts_its_event() -> None:
    """A healthy rollout explains every move in an Event a person can read with kubectl."""
    world = stable_world()
    start_v2(world)
    digest = world.status.rollout.spec_hash
    for _ in range(5):
        world.tick(60)
    world.tick()
    steps = [
        ("Normal", "StepAdvanced", f"step {n}/5: {w}% to the canary")
        for n, w in [(2, 5), (3, 20), (4, 50), (5, 100)]
    ]
    assert events(world) == [
        ("Normal", "RolloutStarted", f"rolling out version 2 (spec {digest}) over steps "
         "[1, 5, 20, 50, 100]"),
        ("Normal", "CanaryReady", "step 1/5: 1% to the canary"),
        *steps,
        ("Normal", "Promoting", "stable track rolling to version 2; canary carries 100%"),
        ("Normal", "Promoted", "version 2 is stable"),
    ]  # fmt: skip
    assert world.status.rollout.message == ""
    assert (world.status.rollout.spec_hash, world.status.rollout.step_index) == (None, None)


def test_reverting_the_spec_mid_rollout_cancels_without_a_rollback() -> None:
    """The spec set back to stable's version: canary gone, Succeeded, no rollback counted."""
    world = stable_world()
    start_v2(world)
    world.tick(60)
    world.clear()
    world.spec = make_rollout_spec("1")
    assert world.tick().trigger == "SpecReverted"
    assert (world.status.phase, world.status.canary_version, world.status.canary_weight) == (
        "Succeeded",
        None,
        0,
    )
    assert (world.status.rollout.spec_hash, world.status.rollout.step_index) == (None, None)
    assert world.status.rollout.message == ""
    assert world.routes[-1] == {Track.STABLE: 100, Track.FALLBACK: 0}
    assert world.canary is None
    assert world.rolled(Track.STABLE) == []
    assert not world.of(IncrementCounter)
    assert events(world) == [("Normal", "RolloutCancelled", "the spec is the stable one again")]


def test_a_restarted_rollout_starts_with_clean_counters() -> None:
    """A new spec after a failed analysis restarts at weight 0 and forgets the old failures."""
    world = stable_world()
    start_v2(world)
    world.metrics["errors"] = 0.5
    world.tick(60)
    assert world.status.rollout.failed_analyses == 1
    world.clear()
    world.spec = make_rollout_spec("3")
    world.tick()
    counters = (world.status.rollout.failed_analyses, world.status.rollout.inconclusive_analyses)
    assert counters == (0, 0)
    assert world.status.rollout.analyses == []
    digest = world.status.rollout.spec_hash
    assert events(world) == [
        ("Normal", "RolloutRestarted", f"rolling out version 3 (spec {digest}) over steps "
         "[1, 5, 20, 50, 100]"),
    ]  # fmt: skip


def test_holding_starts_at_the_inconclusive_threshold_and_a_failure_resets_it() -> None:
    """Exactly `inconclusiveThreshold` (3) inconclusive analyses in a row hold the rollout.

    Each one is a Warning; a failed analysis then counts as a failure and restarts the
    inconclusive count.
    """
    world = stable_world()
    start_v2(world)
    world.metrics["requests"] = 3
    world.tick(60)
    world.tick(60)
    assert (world.status.phase, world.status.rollout.inconclusive_analyses) == ("Progressing", 2)
    world.tick(60)
    assert (world.status.phase, world.status.rollout.inconclusive_analyses) == ("Holding", 3)
    assert [(kind, reason) for kind, reason, _ in events(world)[-3:]] == [
        ("Warning", "AnalysisInconclusive")
    ] * 3
    world.metrics = dict(HEALTHY, errors=0.5)
    world.tick(60)
    rollout_state = world.status.rollout
    assert (rollout_state.failed_analyses, rollout_state.inconclusive_analyses) == (1, 0)
    kind, reason, detail = events(world)[-1]
    assert (kind, reason) == ("Warning", "AnalysisFailed")
    assert detail == rollout_state.message
    assert "error-rate" in detail


def test_failover_events_and_what_counts_as_serving() -> None:
    """Failover Events, and which replicas count as serving.

    The canary's replicas count while it carries weight, so a stable track scaled away under
    `maxSurgeGPUs` is no outage; an error ratio exactly at the limit is not above it.
    """
    world = stable_world()
    start_v2(world)
    assert world.status.canary_weight == 1
    world.clear()
    world.stable = changed(world.stable, available=0)
    world.tick()
    assert not rollout.fallback_active(world.status)
    world.stable = changed(world.stable, available=2)
    world.canary = changed(world.canary, available=0)
    world.tick()
    assert not rollout.fallback_active(world.status)
    facts = Facts(stable=world.stable, canary=world.canary, stable_error_ratio=0.5)
    at_limit = rollout.next_step(world.spec, world.status, facts, world.clock.now)
    assert not rollout.fallback_active(at_limit.status)
    assert events(world) == []
    world.stable = changed(world.stable, available=0)
    world.tick()
    assert rollout.fallback_active(world.status)
    world.stable = changed(world.stable, available=2)
    world.tick()
    assert not rollout.fallback_active(world.status)
    assert events(world) == [
        ("Warning", "FallbackActivated", "the GPU tracks have no available replica"),
        ("Normal", "FallbackDeactivated", "the GPU tracks serve again"),
    ]


def test_a_starting_canary_at_weight_zero_does_not_count_as_serving() -> None:
    """Before its first step the canary carries nothing: no stable replica means failover."""
    world = stable_world()
    world.canary_becomes_ready = False
    world.spec = make_rollout_spec("2")
    world.tick()
    assert (world.status.phase, world.status.canary_weight) == ("Starting", 0)
    world.canary = changed(world.canary, available=1)
    world.stable = changed(world.stable, available=0)
    facts = Facts(stable=world.stable, canary=world.canary)
    step = rollout.next_step(world.spec, world.status, facts, world.clock.now)
    assert rollout.fallback_active(step.status)


def test_no_failover_when_the_fallback_is_disabled() -> None:
    """`fallback.enabled: false`: no replica left still routes to the GPU tracks."""
    world = stable_world()
    spec = world.spec.model_copy(
        update={"fallback": world.spec.fallback.model_copy(update={"enabled": False})}
    )
    facts = Facts(stable=changed(world.stable, available=0), stable_error_ratio=0.9)
    step = rollout.next_step(spec, world.status, facts, world.clock.now)
    assert not rollout.fallback_active(step.status)
    assert step.actions == ()


def test_transition_time_and_promoted_condition_follow_the_phase() -> None:
    """`lastTransitionTime` moves only when the phase changes.

    `Promoted` is True only when Succeeded, with the phase as its reason.
    """
    world = stable_world()
    settled_at = world.status.last_transition_time
    world.tick(30)
    assert world.status.last_transition_time == settled_at
    world.spec = make_rollout_spec("2")
    world.tick(30)
    assert world.status.phase == "Starting"
    assert world.status.last_transition_time == rfc3339(world.clock.now)
    assert world.status.last_transition_time != settled_at
    promoted = world.status.condition(ConditionType.PROMOTED)
    assert promoted is not None
    assert (promoted.status, promoted.reason) == ("False", "Starting")


def test_an_ignored_command_is_a_warning_event() -> None:
    """A command with no row in the phase is acknowledged, cleared and reported as ignored."""
    world = stable_world()
    world.annotations[RolloutCommand.PAUSE.annotation] = "yes"
    world.tick()
    ack = world.status.rollout.acknowledged[-1]
    assert (ack.value, ack.result) == ("yes", "ignored in phase Succeeded")
    assert events(world) == [
        ("Warning", "CommandIgnored", f"{RolloutCommand.PAUSE.annotation}=yes: "
         "ignored in phase Succeeded"),
    ]  # fmt: skip
    assert ClearAnnotation(RolloutCommand.PAUSE.annotation) in world.actions


def test_back_from_the_fallback_the_interval_starts_afresh() -> None:
    """However long the failover lasted, the canary gets a full interval once back.

    One stable and one canary replica together serve again; the condition says why.
    """
    world = stable_world()
    start_v2(world)
    world.stable = changed(world.stable, available=0)
    world.canary = changed(world.canary, available=0)
    world.tick()
    world.tick(600)
    world.stable = changed(world.stable, available=1)
    world.canary = changed(world.canary, available=1)
    world.tick()
    condition = world.status.condition(ConditionType.FALLBACK_ACTIVE)
    assert condition is not None
    assert (condition.status, condition.reason, condition.message) == (
        "False",
        "GPUTrackServing",
        "the GPU tracks serve again",
    )
    assert world.status.rollout.analyses == []
    world.tick(30)
    assert world.status.canary_weight == 1
    world.tick(30)
    assert world.status.canary_weight == 5


def test_an_applied_command_is_acknowledged_with_its_transition() -> None:
    """The acknowledgement and its Normal Event name the phase change; an empty value counts."""
    world = stable_world()
    start_v2(world)
    world.clear()
    world.annotations[RolloutCommand.PAUSE.annotation] = ""
    world.tick()
    ack = world.status.rollout.acknowledged[-1]
    assert (ack.value, ack.result) == ("", "Progressing -> Paused")
    assert events(world) == [
        (
            "Normal",
            "CommandAcknowledged",
            f"{RolloutCommand.PAUSE.annotation}=: Progressing -> Paused",
        )
    ]
    promoted = world.status.condition(ConditionType.PROMOTED)
    assert promoted is not None
    assert promoted.message == world.status.rollout.message == "paused by annotation at 1%"


@pytest.mark.parametrize(
    ("cause", "reason", "detail"),
    [
        pytest.param({"abort": "now"}, "Aborted", "the abort annotation was set", id="abort"),
        pytest.param(
            {"oom_killed": True, "restarts": 1},
            "CanaryOOMKilled",
            "a canary container was OOMKilled",
            id="oom",
        ),
        pytest.param(
            {"restarts": 2}, "CanaryRestarted", "canary containers restarted 2x", id="restart"
        ),
    ],
)
def test_a_rollback_says_what_was_withdrawn_and_why(
    cause: dict[str, Any], reason: str, detail: str
) -> None:
    """The status message and the Warning Event name the cause, the version and the weight."""
    world = stable_world()
    start_v2(world)
    world.clear()
    if "abort" in cause:
        world.annotations[RolloutCommand.ABORT.annotation] = cause["abort"]
    else:
        world.canary = changed(world.canary, **cause)
    world.tick()
    message = f"{reason}: version 2 withdrawn at 1%: {detail}"
    assert (world.status.phase, world.status.rollout.message) == ("RolledBack", message)
    assert ("Warning", "RolledBack", message) in events(world)
    assert world.of(IncrementCounter) == [IncrementCounter(OperatorCounter.ROLLBACKS, reason)]
    assert world.status.rollout.step_index is None


def test_a_canary_never_ready_fails_with_the_deadline_in_the_message() -> None:
    """Past `progressDeadline` the rollout is Failed, and says which deadline passed."""
    world = stable_world()
    world.canary_becomes_ready = False
    world.spec = make_rollout_spec("2")
    world.tick()
    world.clear()
    world.tick(300)
    message = (
        "CanaryNotReady: version 2 withdrawn at 0%: "
        "the canary did not become Ready within progressDeadline 5m"
    )
    assert (world.status.phase, world.status.rollout.message) == ("Failed", message)
    assert events(world) == [("Warning", "Failed", message)]


def test_promote_next_by_hand_is_its_own_event() -> None:
    """`promote: next` moves one step and says a person did it."""
    world = stable_world()
    start_v2(world)
    world.clear()
    world.annotations[RolloutCommand.PROMOTE.annotation] = "next"
    world.tick()
    assert ("Normal", "PromotedByHand", "step 2/5: 5% to the canary") in events(world)


def test_resume_from_holding_starts_a_fresh_interval_and_count() -> None:
    """Resuming a held rollout forgets the inconclusive streak and waits a full interval."""
    world = stable_world()
    start_v2(world)
    world.metrics["requests"] = 3
    for _ in range(3):
        world.tick(60)
    assert world.status.phase == "Holding"
    world.tick(30)
    world.annotations[RolloutCommand.RESUME.annotation] = "1"
    world.tick()
    state = world.status.rollout
    assert (world.status.phase, state.inconclusive_analyses, state.message) == (
        "Progressing",
        0,
        "resumed at 1%",
    )
    world.metrics = dict(HEALTHY)
    world.tick(30)
    assert world.status.canary_weight == 1
    world.tick(30)
    assert world.status.canary_weight == 5


def test_without_analysis_each_interval_passes_on_readiness_and_time() -> None:
    """No analysis configured: every interval is a recorded pass with the weight it held."""
    world = World(make_rollout_spec("1", analysis=None))
    world.tick()
    world.tick()
    world.spec = make_rollout_spec("2", analysis=None)
    world.tick()
    world.tick()
    world.tick(60)
    world.tick(60)
    assert world.status.canary_weight == 20
    first, second = world.status.rollout.analyses
    message = "no analysis configured: judged on readiness and time alone"
    assert (first.verdict, first.message, first.weight) == ("Passed", message, 1)
    assert (second.verdict, second.weight) == ("Passed", 5)
    assert second.time == rfc3339(world.clock.now)


def test_a_due_analysis_without_a_result_is_inconclusive() -> None:
    """With analysis configured, a tick that brings no result never counts as a pass."""
    world = stable_world()
    start_v2(world)
    world.clock.advance(60)
    facts = Facts(stable=world.stable, canary=world.canary)
    step = rollout.next_step(world.spec, world.status, facts, world.clock.now)
    (result,) = step.status.rollout.analyses
    assert (result.verdict, result.reason) == ("Inconclusive", "NotRun")
    assert result.message == "the analysis was due but no result was supplied"
    detail = "NotRun: the analysis was due but no result was supplied (1/3 inconclusive analyses)"
    assert step.status.rollout.message == detail
    assert EventNote("Warning", "AnalysisInconclusive", detail) in step.actions


def test_a_spec_changed_before_the_first_deploy_is_ready_is_adopted_directly() -> None:
    """While the very first stable is still Pending, a newer spec replaces it: no canary."""
    world = World(make_rollout_spec("1"))
    world.tick()
    assert world.status.phase == "Pending"
    world.spec = make_rollout_spec("2")
    assert world.tick().trigger == "Adopt"
    assert world.rolled(Track.CANARY) == []
    assert [template.version for template in world.rolled(Track.STABLE)] == ["1", "2"]


def test_a_command_still_present_after_its_acknowledgement_acts_once() -> None:
    """Until the annotation's removal lands, the same value is not acted on again.

    A new value replaces the old acknowledgement instead of piling up.
    """
    world = stable_world()
    start_v2(world)
    annotation = RolloutCommand.PROMOTE.annotation
    world.annotations[annotation] = "next"
    world.tick()
    assert world.status.canary_weight == 5
    world.annotations[annotation] = "next"
    world.tick()
    assert world.status.canary_weight == 5
    world.annotations[annotation] = "again"
    world.tick()
    assert [(a.annotation, a.value) for a in world.status.rollout.acknowledged] == [
        (annotation, "again")
    ]


def test_no_canary_observed_yet_is_no_crash() -> None:
    """Right after a rollout starts the canary Deployment may not be observed at all."""
    world = stable_world()
    world.spec = make_rollout_spec("2")
    world.tick()
    facts = Facts(stable=world.stable)
    step = rollout.next_step(world.spec, world.status, facts, world.clock.now)
    assert (step.trigger, step.status.phase) == (None, "Starting")


def test_a_refused_first_spec_is_adopted_once_fixed() -> None:
    """A first spec refused as invalid leaves Failed; the corrected spec is deployed as stable."""
    world = World(make_rollout_spec("1"))
    world.status = rollout.next_step(None, world.status, Facts(), world.clock.now).status
    assert world.status.phase == "Failed"
    assert world.tick().trigger == "Adopt"
    assert world.status.phase == "Pending"
    world.tick()
    assert world.status.phase == "Succeeded"


def test_first_sight_of_a_stable_already_serving_the_spec_is_succeeded() -> None:
    """No status yet but the stable Deployment already runs the spec: nothing to wait for.

    The stable version is recorded too: the next rollout's analysis compares the canary
    with the stable track's series by that version, and without it finds none.
    """
    world = World(make_rollout_spec("1"))
    serving = TrackFacts(world.spec.gpu_track.digest, available=2, replicas=2, rolled_out=True)
    step = rollout.next_step(world.spec, world.status, Facts(stable=serving), world.clock.now)
    assert (step.trigger, step.status.phase) == ("Adopt", "Succeeded")
    assert step.status.stable_version == "1"


def test_the_status_message_follows_each_move() -> None:
    """Starting, the first step and promotion each say where the rollout stands."""
    world = stable_world()
    world.canary_becomes_ready = False
    world.spec = make_rollout_spec("2")
    world.tick()
    digest = world.status.rollout.spec_hash
    assert world.status.rollout.message == (
        f"waiting for the canary to become Ready: rolling out version 2 (spec {digest}) "
        "over steps [1, 5, 20, 50, 100]"
    )
    world.canary = changed(world.canary, available=1, rolled_out=True)
    world.tick()
    assert world.status.rollout.message == "step 1/5: 1% to the canary"
    world.annotations[RolloutCommand.PROMOTE.annotation] = "full"
    world.tick()
    message = "stable track rolling to version 2; canary carries 100%"
    assert (world.status.phase, world.status.rollout.message) == ("Promoting", message)


def test_a_spec_changed_during_promotion_never_reaches_the_stable_track() -> None:
    """Promotion moves stable to the version that passed analysis, not to a newer spec."""
    world = stable_world()
    start_v2(world)
    world.annotations[RolloutCommand.PROMOTE.annotation] = "full"
    world.tick()
    world.stable = changed(world.stable, rolled_out=False)
    world.spec = make_rollout_spec("3")
    world.tick()
    assert [template.version for template in world.rolled(Track.STABLE)] == ["2"]


def test_a_failed_analysis_below_the_threshold_starts_a_fresh_interval() -> None:
    """After one failure (of 2) the canary gets a whole new interval before the next verdict."""
    world = stable_world()
    start_v2(world)
    world.metrics["errors"] = 0.5
    world.tick(60)
    assert (world.status.phase, world.status.rollout.failed_analyses) == ("Progressing", 1)
    world.tick(30)
    assert (world.status.phase, world.status.rollout.failed_analyses) == ("Progressing", 1)
    world.tick(30)
    assert world.status.phase == "RolledBack"


@pytest.mark.parametrize(
    ("bad", "counter"),
    [
        pytest.param({"errors": 0.5}, "failed_analyses", id="failures"),
        pytest.param({"requests": 3}, "inconclusive_analyses", id="inconclusive"),
    ],
)
def test_a_passed_step_breaks_the_streak(bad: dict[str, float], counter: str) -> None:
    """Thresholds count analyses in a row: a pass in between starts the count again."""
    world = stable_world()
    start_v2(world)
    world.metrics |= bad
    world.tick(60)
    assert getattr(world.status.rollout, counter) == 1
    world.metrics = dict(HEALTHY)
    world.tick(60)
    assert (world.status.canary_weight, getattr(world.status.rollout, counter)) == (5, 0)


def test_a_restart_clears_the_old_step_and_interval() -> None:
    """A new spec mid-rollout starts from no step, no interval and no inconclusive streak."""
    world = stable_world()
    start_v2(world)
    world.tick(60)
    world.metrics["requests"] = 3
    world.tick(60)
    assert (world.status.rollout.step_index, world.status.rollout.inconclusive_analyses) == (1, 1)
    world.canary_becomes_ready = False
    world.spec = make_rollout_spec("3")
    world.tick()
    state = world.status.rollout
    assert (world.status.phase, state.step_index, state.interval_started_at) == (
        "Starting",
        None,
        None,
    )
    assert state.inconclusive_analyses == 0


def test_reverting_the_spec_after_a_rollback_clears_the_rollback_message() -> None:
    """Back on stable's spec, the status no longer reports the withdrawn version."""
    world = stable_world()
    start_v2(world)
    world.annotations[RolloutCommand.ABORT.annotation] = "now"
    world.tick()
    assert world.status.rollout.message.startswith("Aborted: version 2 withdrawn")
    world.spec = make_rollout_spec("1")
    assert world.tick().trigger == "SpecReverted"
    assert (world.status.phase, world.status.rollout.message) == ("Succeeded", "")


@pytest.mark.parametrize(
    ("knobs", "kept"),
    [
        pytest.param({"analysis": ANALYSIS | {"historyLimit": 3}}, 3, id="history-limit"),
        pytest.param({"analysis": None}, 10, id="ten-without-analysis"),
    ],
)
def test_the_analysis_history_is_bounded(knobs: dict[str, Any], kept: int) -> None:
    """Only the newest `historyLimit` analyses stay in status (10 without analysis config)."""
    steps = {"steps": [*range(1, 12), 100]}
    world = World(make_rollout_spec("1", **steps, **knobs))
    world.tick()
    world.tick()
    world.spec = make_rollout_spec("2", **steps, **knobs)
    world.tick()
    world.tick()
    for _ in range(11):
        world.tick(60)
    analyses = world.status.rollout.analyses
    assert len(analyses) == kept
    assert analyses[-1].weight == 11
