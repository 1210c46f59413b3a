"""CPU fallback failover: when it starts and ends, what counts as serving, the rollout frozen."""

from __future__ import annotations

from fleetserve_operator import rollout
from fleetserve_operator.naming import Track
from fleetserve_operator.rollout import Facts
from fleetserve_operator.spec import ConditionType
from fleetserve_operator.testing.rollout import (
    canary_world,
    changed,
    events,
    route_weights,
    stable_world,
    starting_world,
)


def test_fallback_on_and_off_and_no_advance_while_active() -> None:
    """No stable replica: traffic to the CPU fallback, rollout frozen; back when healthy."""
    world = canary_world()
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


def test_failover_events_and_what_counts_as_serving() -> None:
    """Failover Events, and which replicas count as serving.

    The canary's replicas count while it carries weight, so a stable track scaled away under
    `maxSurgeGPUs` is no outage; an error ratio exactly at the limit is not above it.
    """
    world = canary_world()
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
    world = starting_world()
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


def test_back_from_the_fallback_the_interval_starts_afresh() -> None:
    """However long the failover lasted, the canary gets a full interval once back.

    One stable and one canary replica together serve again; the condition says why.
    """
    world = canary_world()
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
