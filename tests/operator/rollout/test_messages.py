"""What a person reads: the Event each move posts, and the status message of each step."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_operator.rollout import IncrementCounter, OperatorCounter
from fleetserve_operator.spec import RolloutCommand
from fleetserve_operator.testing.rollout import (
    canary_world,
    changed,
    events,
    starting_world,
)


def test_each_move_posts_its_event() -> None:
    """A healthy rollout explains every move in an Event a person can read with kubectl."""
    world = canary_world()
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
        pytest.param(
            {"restarts": 1, "fetch_failure": ("AccessDenied", "pod p: model fetch failed: 403")},
            "AccessDenied",
            "pod p: model fetch failed: 403",
            id="fetch-failed",
        ),
    ],
)
def test_a_rollback_says_what_was_withdrawn_and_why(
    cause: dict[str, Any], reason: str, detail: str
) -> None:
    """The status message and the Warning Event name the cause, the version and the weight."""
    world = canary_world()
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
    world = starting_world()
    world.clear()
    world.tick(300)
    message = (
        "CanaryNotReady: version 2 withdrawn at 0%: "
        "the canary did not become Ready within progressDeadline 5m"
    )
    assert (world.status.phase, world.status.rollout.message) == ("Failed", message)
    assert events(world) == [("Warning", "Failed", message)]


def test_the_status_message_follows_each_move() -> None:
    """Starting, the first step and promotion each say where the rollout stands."""
    world = starting_world()
    digest = world.status.rollout.spec_hash
    assert world.status.rollout.message == (
        f"waiting for the canary to become Ready: rolling out version 2 (spec {digest}) "
        "over steps [1, 5, 20, 50, 100]"
    )
    world.canary = changed(world.canary, available=1, rolled_out=True)
    world.tick()
    assert world.status.rollout.message == "step 1/5: 1% to the canary"
    world.command(RolloutCommand.PROMOTE, "full")
    message = "stable track rolling to version 2; canary carries 100%"
    assert (world.status.phase, world.status.rollout.message) == ("Promoting", message)
