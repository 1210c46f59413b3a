"""A rollout from adoption to promotion or rollback: restarts, new specs, deadlines, crashes."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_operator import rollout
from fleetserve_operator.naming import Track
from fleetserve_operator.records import rfc3339
from fleetserve_operator.rollout import Facts, IncrementCounter, OperatorCounter, TrackFacts
from fleetserve_operator.spec import (
    ConditionType,
    InferenceServiceStatus,
    RolloutCommand,
    RolloutPhase,
)
from fleetserve_operator.testing.rollout import (
    Template,
    World,
    canary_world,
    changed,
    events,
    make_rollout_spec,
    stable_world,
    starting_world,
    weights,
)


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
    world = canary_world()
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


def test_restart_mid_step_resumes_the_same_step() -> None:
    """A status written and read back (operator restart) yields the same step, no actions."""
    world = canary_world()
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


def _promoting_v2() -> World:
    """v2 promoted by hand, the stable track not yet rolled out to it."""
    world = canary_world()
    world.command(RolloutCommand.PROMOTE, "full")
    world.stable = changed(world.stable, rolled_out=False)
    return world


def test_restart_while_promoting_never_promotes_twice() -> None:
    """Promoting with the stable not yet rolled out: repeated calls render no second promotion."""
    world = _promoting_v2()
    promoted = world.rolled(Track.STABLE)
    assert [template.version for template in promoted] == ["2"]
    for _ in range(3):
        world.tick(30)
    assert world.status.phase == "Promoting"
    assert world.rolled(Track.STABLE) == promoted
    assert not world.of(IncrementCounter)


def test_new_spec_during_a_rollout_restarts_with_the_newest_version() -> None:
    """v3 arrives while v2 is at 5%: the canary is re-templated to v3 at weight 0."""
    world = canary_world()
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
    world = starting_world()
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
        pytest.param(
            {"restarts": 1, "fetch_failure": ("DigestMismatch", "sha256 differs")},
            "DigestMismatch",
            id="fetch-failed",
        ),
    ],
)
def test_canary_crash_fails_at_once(crash: dict[str, Any], reason: str) -> None:
    """An OOM kill or a restart during a step rolls back without waiting for the interval."""
    world = canary_world()
    world.canary = changed(world.canary, **crash)
    world.tick()
    assert world.status.phase == "RolledBack"
    assert world.of(IncrementCounter) == [IncrementCounter(OperatorCounter.ROLLBACKS, reason)]


def test_retry_annotation_and_revert_after_a_rollback() -> None:
    """`retry` rolls the same spec out again; reverting the spec settles back to Succeeded."""
    world = canary_world()
    world.command(RolloutCommand.ABORT, "now")
    world.tick()
    assert world.status.phase == "RolledBack"
    world.command(RolloutCommand.RETRY, "1")
    assert (world.status.phase, world.status.canary_version) == ("Starting", "2")
    world.command(RolloutCommand.ABORT, "again")
    world.spec = make_rollout_spec("1")
    world.tick()
    assert (world.status.phase, world.status.rollout.spec_hash) == ("Succeeded", None)


@pytest.mark.parametrize("phase", list(RolloutPhase))
def test_a_refused_spec_fails_the_rollout_in_every_phase(phase: RolloutPhase) -> None:
    """The table decides `Failed` for an invalid spec; rollout state and traffic are kept.

    A fallback that is active stays active although the tracks look healthy: a refused
    spec says nothing about them.
    """
    world = canary_world()
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


def test_a_refused_spec_leaves_no_canary_traffic_or_replicas() -> None:
    """Failed keeps the last canary weight in status, but routes nothing and runs no canary."""
    world = canary_world()
    world.tick(60)
    failed = rollout.next_step(None, world.status, world.facts(), world.clock.now).status
    assert (failed.phase, failed.canary_weight) == ("Failed", 5)
    split = rollout.traffic_split(failed)
    assert (split.stable, split.canary, split.fallback) == (100, 0, 0)
    plan = rollout.plan_capacity(world.spec, failed, stable_replicas=2)
    assert (plan.stable, plan.canary) == (2, 0)


def test_reverting_the_spec_mid_rollout_cancels_without_a_rollback() -> None:
    """The spec set back to stable's version: canary gone, Succeeded, no rollback counted."""
    world = canary_world()
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
    world = canary_world()
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


def test_a_spec_changed_before_the_first_deploy_is_ready_is_adopted_directly() -> None:
    """While the very first stable is still Pending, a newer spec replaces it: no canary."""
    world = World(make_rollout_spec("1"))
    world.tick()
    assert world.status.phase == "Pending"
    world.spec = make_rollout_spec("2")
    assert world.tick().trigger == "Adopt"
    assert world.rolled(Track.CANARY) == []
    assert [template.version for template in world.rolled(Track.STABLE)] == ["1", "2"]


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


def test_a_spec_changed_during_promotion_never_reaches_the_stable_track() -> None:
    """Promotion moves stable to the version that passed analysis, not to a newer spec."""
    world = _promoting_v2()
    world.spec = make_rollout_spec("3")
    world.tick()
    assert [template.version for template in world.rolled(Track.STABLE)] == ["2"]


def test_a_restart_clears_the_old_step_and_interval() -> None:
    """A new spec mid-rollout starts from no step, no interval and no inconclusive streak."""
    world = canary_world()
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
    world = canary_world()
    world.command(RolloutCommand.ABORT, "now")
    assert world.status.rollout.message.startswith("Aborted: version 2 withdrawn")
    world.spec = make_rollout_spec("1")
    assert world.tick().trigger == "SpecReverted"
    assert (world.status.phase, world.status.rollout.message) == ("Succeeded", "")
