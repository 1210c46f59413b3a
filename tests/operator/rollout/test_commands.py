"""Command annotations: acted on once, acknowledged in status, cleared and reported."""

from __future__ import annotations

import pytest

from fleetserve_operator.records import EventNote
from fleetserve_operator.rollout import ClearAnnotation
from fleetserve_operator.spec import ConditionType, RolloutCommand
from fleetserve_operator.testing.rollout import HEALTHY, canary_world, events, stable_world, weights


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
    world = canary_world()
    world.command(command, value)
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
    world = canary_world()
    world.command(RolloutCommand.PAUSE, "1")
    for _ in range(3):
        world.tick(60)
    assert (world.status.phase, world.status.canary_weight) == ("Paused", 1)
    assert len(world.status.rollout.analyses) == 3
    world.command(RolloutCommand.RESUME, "1")
    assert world.status.phase == "Progressing"
    world.tick(60)
    assert world.status.canary_weight == 5


def test_paused_canary_still_rolls_back_on_failures() -> None:
    """Pausing never pauses safety: failed analyses still roll the canary back."""
    world = canary_world()
    world.command(RolloutCommand.PAUSE, "1")
    world.metrics["errors"] = 0.5
    world.tick(60)
    world.tick(60)
    assert world.status.phase == "RolledBack"


def test_command_without_a_row_is_acknowledged_as_ignored() -> None:
    """Promoting a service with no rollout changes nothing, and says so."""
    world = stable_world()
    world.command(RolloutCommand.PROMOTE, "next")
    assert world.status.phase == "Succeeded"
    assert world.status.rollout.acknowledged[-1].result == "ignored in phase Succeeded"


def test_an_ignored_command_is_a_warning_event() -> None:
    """A command with no row in the phase is acknowledged, cleared and reported as ignored."""
    world = stable_world()
    world.command(RolloutCommand.PAUSE, "yes")
    ack = world.status.rollout.acknowledged[-1]
    assert (ack.value, ack.result) == ("yes", "ignored in phase Succeeded")
    assert events(world) == [
        ("Warning", "CommandIgnored", f"{RolloutCommand.PAUSE.annotation}=yes: "
         "ignored in phase Succeeded"),
    ]  # fmt: skip
    assert ClearAnnotation(RolloutCommand.PAUSE.annotation) in world.actions


def test_an_applied_command_is_acknowledged_with_its_transition() -> None:
    """The acknowledgement and its Normal Event name the phase change; an empty value counts."""
    world = canary_world()
    world.clear()
    world.command(RolloutCommand.PAUSE, "")
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


def test_promote_next_by_hand_is_its_own_event() -> None:
    """`promote: next` moves one step and says a person did it."""
    world = canary_world()
    world.clear()
    world.command(RolloutCommand.PROMOTE, "next")
    assert ("Normal", "PromotedByHand", "step 2/5: 5% to the canary") in events(world)


def test_resume_from_holding_starts_a_fresh_interval_and_count() -> None:
    """Resuming a held rollout forgets the inconclusive streak and waits a full interval."""
    world = canary_world()
    world.metrics["requests"] = 3
    for _ in range(3):
        world.tick(60)
    assert world.status.phase == "Holding"
    world.tick(30)
    world.command(RolloutCommand.RESUME, "1")
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


def test_a_command_still_present_after_its_acknowledgement_acts_once() -> None:
    """Until the annotation's removal lands, the same value is not acted on again.

    A new value replaces the old acknowledgement instead of piling up.
    """
    world = canary_world()
    world.command(RolloutCommand.PROMOTE, "next")
    assert world.status.canary_weight == 5
    world.command(RolloutCommand.PROMOTE, "next")
    assert world.status.canary_weight == 5
    world.command(RolloutCommand.PROMOTE, "again")
    assert [(a.annotation, a.value) for a in world.status.rollout.acknowledged] == [
        (RolloutCommand.PROMOTE.annotation, "again")
    ]
