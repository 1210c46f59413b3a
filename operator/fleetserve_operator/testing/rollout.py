"""A simulated world for the rollout state machine: a FakeClock, scripted metrics, tracks.

`World` renders the children from every status `rollout.next_step` returns, as `sync` does
(`render.desired_children`), and plays the Deployment controller on what it rendered, so a
test asserts on the status and on those rendered children (routes, replica counts, pod
templates), with no cluster and no Prometheus.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from fleetserve_operator import analysis, naming, render, rollout
from fleetserve_operator.analysis import REJECTIONS, SERVER_ERRORS, agreement
from fleetserve_operator.contract import QUEUE_WAIT_METRIC, REQUEST_DURATION_METRIC
from fleetserve_operator.naming import Track
from fleetserve_operator.records import EventNote, Manifest
from fleetserve_operator.render import Owner
from fleetserve_operator.rollout import ClearAnnotation, Facts, TrackFacts, Transition
from fleetserve_operator.spec import (
    AnalysisResult,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutCommand,
    RolloutPhase,
    ShadowCounts,
    ShadowEvidence,
    Verdict,
)
from fleetserve_operator.testing.fakes import FakeClock, ScriptedMetricSource, make_spec

__all__ = [
    "event_reasons",
    "ANALYSIS",
    "HEALTHY",
    "OWNER",
    "TRAFFIC",
    "Template",
    "World",
    "canary_world",
    "changed",
    "events",
    "make_rollout_spec",
    "route_weights",
    "stable_world",
    "start_v2",
    "starting_world",
    "weights",
]

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
    shadow: ShadowCounts | None = None
    """The stable pods' shadow sums Prometheus answers while shadowing; None: no series."""
    children_seen: list[Manifest] = field(default_factory=list)
    """The children rendered for the current status."""

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
        evidence, judged = self.shadow_look()
        return Facts(
            stable=self.stable,
            canary=self.canary,
            annotations=dict(self.annotations),
            analysis=result or judged,
            shadow_evidence=evidence,
        )

    def shadow_look(self) -> tuple[ShadowEvidence | None, AnalysisResult | None]:
        """While shadowing, as `sync` looks: the evidence, and the verdict when due or Failed."""
        shadow, stage = self.spec.rollout.shadow, self.status.rollout.shadow
        if shadow is None or stage is None or self.status.phase != RolloutPhase.SHADOWING:
            return None, None
        version = self.status.canary_version or ""
        scope = analysis.TrackScope("ns", "demo", self.status.stable_version or "", Track.STABLE)
        queries = agreement.shadow_queries(scope, version)
        counts = self.shadow.model_dump() if self.shadow is not None else {}
        source = ScriptedMetricSource(
            values={query: counts.get(name) for name, query in queries.items()},
            online=self.prometheus_online,
        )
        policy = agreement.ShadowPolicy.of(shadow)
        evidence, result = agreement.watch(source, policy, scope, version, stage.evidence)
        due = rollout.is_shadow_due(self.spec, self.status, self.clock.now)
        return evidence, result if due or result.verdict is Verdict.FAILED else None

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

    def command(self, command: RolloutCommand, value: str) -> Transition:
        """Set `command`'s annotation to `value` and tick once: the reconcile that reads it."""
        self.annotations[command.annotation] = value
        return self.tick()

    def children(self, status: InferenceServiceStatus) -> list[Manifest]:
        """The children `sync` renders for `status`."""
        observed = self.stable.replicas if self.stable else 0
        return render.desired_children(OWNER, self.spec, status, observed_stable_replicas=observed)

    def render(self) -> None:
        """Render the children of the current status and play the Deployment controller."""
        children = self.children(self.status)
        self.children_seen = children
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


def starting_world() -> World:
    """Version 1 stable, version 2 Starting: its canary rendered, and never becoming Ready."""
    world = stable_world()
    world.canary_becomes_ready = False
    world.spec = make_rollout_spec("2")
    world.tick()
    return world


def canary_world() -> World:
    """Version 1 stable, version 2's canary Ready at the first step: where rollouts are judged."""
    world = stable_world()
    start_v2(world)
    return world


def changed(track: TrackFacts | None, **changes: Any) -> TrackFacts:
    """An observed track with some facts changed."""
    assert track is not None
    return replace(track, **changes)


def weights(world: World) -> list[int]:
    """The canary weights the HTTPRoute was rendered with since the base, in order."""
    return [route.get(Track.CANARY, 0) for route in world.routes[1:]]


def events(world: World) -> list[tuple[str, str, str]]:
    """The Events posted so far, as (type, reason, message)."""
    return [(e.type, e.reason, e.message) for e in world.of(EventNote)]


def event_reasons(world: World) -> list[str]:
    """The reasons of the Events posted so far, in order."""
    return [reason for _, reason, _ in events(world)]
