"""The rollout state machine, stepped with a FakeClock, scripted metrics and simulated tracks.

The world renders the children from every status `next_step` returns, as `sync` does
(`reconcile.desired_children`), and plays the Deployment controller on what it rendered;
the tests assert on the status and on those rendered children.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from fleetserve_operator import analysis, naming, reconcile, rollout
from fleetserve_operator.analysis import (
    REJECTIONS,
    SERVER_ERRORS,
)
from fleetserve_operator.contract import QUEUE_WAIT_METRIC, REQUEST_DURATION_METRIC
from fleetserve_operator.naming import Track
from fleetserve_operator.reconcile import Owner
from fleetserve_operator.records import EventNote, Manifest
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
        return reconcile.desired_children(
            OWNER, self.spec, status, observed_stable_replicas=observed
        )

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
