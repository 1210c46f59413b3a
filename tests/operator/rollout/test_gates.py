"""Holds and manual gates of single steps: waiting, approving, and surviving restarts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator.rollout import ClearAnnotation, Confirmation, Notify, next_step
from fleetserve_operator.spec import InferenceServiceStatus, RolloutCommand, StepWait
from fleetserve_operator.testing.rollout import (
    World,
    event_reasons,
    make_rollout_spec,
    stable_world,
    start_v2,
)

HOLD_1 = [{"weight": 1, "hold": "5m"}]
GATE_5 = [{"weight": 5, "gate": "manual"}]


def gated_world(policies: list[dict[str, Any]]) -> World:
    """Version 2's canary Ready at 1%, under `policies`; the Events so far forgotten."""
    world = stable_world(stepPolicies=policies)
    start_v2(world)
    world.clear()
    return world


def awaiting_5() -> World:
    """The canary at 5%, its analysis passed, awaiting approval."""
    world = gated_world(GATE_5)
    world.tick(60)
    world.tick(60)
    assert world.status.rollout.step_gate is not None
    assert world.status.rollout.step_gate.waiting is StepWait.AWAITING_APPROVAL
    return world


def test_a_hold_keeps_the_step_however_often_its_analysis_passes() -> None:
    """1% held 5m with 60 s intervals: four passes wait, the first after the hold advances."""
    world = gated_world(HOLD_1)
    gate = world.status.rollout.step_gate
    assert gate is not None
    assert (gate.weight, gate.started_at, gate.hold_until) == (
        1,
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:05:00Z",
    )
    for _ in range(4):
        world.tick(60)
        assert (world.status.phase, world.status.canary_weight) == ("Progressing", 1)
    gate = world.status.rollout.step_gate
    assert gate is not None
    assert (gate.waiting, gate.waiting_since) == (StepWait.HOLD, "2026-01-01T00:01:00Z")
    assert "held until 2026-01-01T00:05:00Z (hold 5m)" in world.status.rollout.message
    assert len(world.status.rollout.analyses) == 4
    assert event_reasons(world) == ["StepHeld"]
    world.tick(60)
    assert world.status.canary_weight == 5
    assert world.status.rollout.step_gate is None


def test_a_held_step_still_rolls_back() -> None:
    """The hold never holds safety: failing analyses roll the canary back during it."""
    world = gated_world(HOLD_1)
    world.tick(60)
    world.metrics["errors"] = 0.5
    world.tick(60)
    world.tick(60)
    assert (world.status.phase, world.status.canary_weight) == ("RolledBack", 0)
    assert world.status.rollout.step_gate is None


def test_a_manual_gate_waits_until_approved_then_advances_at_once() -> None:
    """5% waits after its pass; `approve=5` advances to 20% in the same reconcile."""
    world = awaiting_5()
    world.tick(60)
    world.tick(60)
    assert (world.status.phase, world.status.canary_weight) == ("Progressing", 5)
    gate = world.status.rollout.step_gate
    assert gate is not None
    assert gate.waiting_since == "2026-01-01T00:02:00Z"
    assert event_reasons(world) == ["StepAdvanced", "AwaitingApproval"]
    assert "approve=5" in world.status.rollout.message
    world.command(RolloutCommand.APPROVE, "5")
    assert world.status.canary_weight == 20
    ack = world.status.rollout.acknowledged[-1]
    assert (ack.value, ack.result) == ("5", "Progressing -> Progressing")
    assert ClearAnnotation(RolloutCommand.APPROVE.annotation) in world.actions
    assert event_reasons(world)[-3:] == ["StepApproved", "StepAdvanced", "CommandAcknowledged"]


@pytest.mark.parametrize("value", ["1", "20", "yes"])
def test_an_approval_of_a_step_not_waiting_is_ignored(value: str) -> None:
    """Only the weight of the step awaiting approval opens it; anything else is a warning."""
    world = awaiting_5()
    world.command(RolloutCommand.APPROVE, value)
    assert world.status.canary_weight == 5
    ack = world.status.rollout.acknowledged[-1]
    assert ack.result == f"ignored: the step awaiting approval is 5%, not {value!r}"
    assert event_reasons(world)[-1] == "CommandIgnored"
    gate = world.status.rollout.step_gate
    assert gate is not None
    assert (gate.waiting, gate.approved_at) == (StepWait.AWAITING_APPROVAL, None)


def test_an_approval_before_the_step_waits_is_ignored() -> None:
    """Approving 5% while it is still analysed does not pre-approve it."""
    world = gated_world(GATE_5)
    world.tick(60)
    world.command(RolloutCommand.APPROVE, "5")
    ack = world.status.rollout.acknowledged[-1].result
    assert ack == "ignored: no step awaits approval in phase Progressing"
    world.tick(60)
    assert world.status.canary_weight == 5


def test_an_approval_is_kept_in_status_when_the_annotation_goes_or_comes_back() -> None:
    """A paused step keeps its approval in status, whatever happens to the annotation.

    Removing or re-applying the annotation loses nothing; after resume the next pass advances.
    """
    world = awaiting_5()
    world.command(RolloutCommand.PAUSE, "1")
    world.command(RolloutCommand.APPROVE, "5")
    assert (world.status.phase, world.status.canary_weight) == ("Paused", 5)
    gate = world.status.rollout.step_gate
    assert gate is not None
    approved_at = gate.approved_at
    assert approved_at == "2026-01-01T00:02:00Z"
    world.tick(10)  # the annotation is gone (cleared): its acknowledgement goes too
    assert world.status.rollout.acknowledged == []
    world.command(RolloutCommand.APPROVE, "5")  # GitOps puts it back
    assert world.status.rollout.acknowledged[-1].result.startswith("ignored")
    gate = world.status.rollout.step_gate
    assert gate is not None
    assert (gate.approved_at, gate.waiting) == (approved_at, None)
    world.command(RolloutCommand.RESUME, "1")
    world.tick(60)
    assert world.status.canary_weight == 20


def test_a_reapplied_spec_restarts_neither_the_hold_nor_the_interval() -> None:
    """Argo CD self-heal re-applies the manifest (no annotations): nothing restarts."""
    world = gated_world(HOLD_1)
    world.tick(90)
    before = world.status.rollout
    for _ in range(3):
        world.spec = make_rollout_spec("2", **world.knobs)
        world.annotations.clear()
        world.tick(5)
    assert world.status.rollout.step_gate == before.step_gate
    assert world.status.rollout.interval_started_at == before.interval_started_at
    world.tick(300 - 105)  # five minutes after the step began: the next pass advances
    assert world.status.canary_weight == 5


def _restarted(world: World) -> World:
    """A new operator: the status as the API server stores it, and nothing in memory."""
    stored = world.status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return World(
        make_rollout_spec("2", **world.knobs),
        knobs=world.knobs,
        clock=world.clock,
        status=InferenceServiceStatus.model_validate(stored),
        stable=world.stable,
        canary=world.canary,
    )


def test_a_restarted_operator_keeps_the_hold_and_the_wait() -> None:
    """Everything is in status: a restart neither restarts the hold nor forgets the wait."""
    world = gated_world([{"weight": 1, "hold": "3m", "gate": "manual"}])
    world.tick(120)
    restarted = _restarted(world)
    restarted.tick(60)
    gate = restarted.status.rollout.step_gate
    assert gate is not None
    assert (gate.started_at, gate.waiting) == ("2026-01-01T00:00:00Z", StepWait.AWAITING_APPROVAL)
    again = _restarted(restarted)
    again.command(RolloutCommand.APPROVE, "1")
    assert again.status.canary_weight == 5


def test_promote_by_hand_skips_a_gate() -> None:
    """`promote=next` is a person's decision too: it leaves a waiting step at once."""
    world = awaiting_5()
    world.command(RolloutCommand.PROMOTE, "next")
    assert world.status.canary_weight == 20


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        pytest.param([{"weight": 10, "gate": "manual"}], "must be one of rollout.steps",
                     id="not-a-step"),
        pytest.param([{"weight": 5}], "needs hold or gate", id="empty"),
        pytest.param([{"weight": 5, "hold": "1m"}, {"weight": 5, "gate": "manual"}],
                     "names a weight twice", id="twice"),
    ],
)  # fmt: skip
def test_invalid_step_policies_are_refused(policies: list[dict[str, Any]], message: str) -> None:
    """Each refusal names the field."""
    with pytest.raises(ValidationError, match=message) as caught:
        make_rollout_spec("1", stepPolicies=policies)
    assert "stepPolicies" in str(caught.value)


def test_an_approval_vetoed_by_a_confirm_webhook_is_kept() -> None:
    """A veto of the approved step keeps the approval; the next allowed pass advances."""
    world = awaiting_5()
    vetoed = replace(
        world.facts(),
        annotations={RolloutCommand.APPROVE.annotation: "5"},
        confirmation=Confirmation(allowed=False, detail="confirm webhook w: answered 403"),
    )
    step = next_step(world.spec, world.status, vetoed, world.clock.now)
    assert step.status.canary_weight == 5
    gate = step.status.rollout.step_gate
    assert gate is not None
    assert gate.approved_at is not None
    assert "vetoed: confirm webhook w: answered 403" in step.status.rollout.message
    world.status = step.status
    world.tick(60)
    assert world.status.canary_weight == 20


def test_notify_webhooks_hear_of_pause_and_resume() -> None:
    """Pause and resume post no Event of their own; a webhook listing them is told."""
    hook = {"name": "chat", "url": "http://127.0.0.1:1/", "events": ["Paused", "Resumed"]}
    world = stable_world(webhooks=[hook])
    start_v2(world)
    world.command(RolloutCommand.PAUSE, "1")
    world.command(RolloutCommand.RESUME, "1")
    told = [(n.webhook.name, n.event.value, n.message) for n in world.of(Notify)]
    assert told == [("chat", "Paused", "paused at 1%"), ("chat", "Resumed", "resumed at 1%")]
