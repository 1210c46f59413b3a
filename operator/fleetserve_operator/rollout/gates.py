"""Holds and manual gates of single steps (`rollout.stepPolicies`): rows and bookkeeping.

A step with a policy advances only when its analysis passed, its `hold` has elapsed since
the canary got its weight, and, with `gate: manual`, the `approve` annotation named its
weight. Until then each passing analysis is recorded and the step waits, saying what for in
`status.rollout.stepGate` and the message (an Event when the wait begins); a failing one
still counts towards a rollback. Everything is kept in status, bound to the rollout's spec
hash and step, so a re-applied spec or a restarted operator neither restarts the hold nor
forgets an approval.

A `confirm` webhook's veto enters as a fact: when a step is otherwise ready to advance
(`asks_confirmation`), the caller asks the webhooks and steps again with their answer; a
veto records the pass and keeps the step, and the next passing analysis asks again.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from fleetserve_operator.records import rfc3339
from fleetserve_operator.rollout.data import Transition, Trigger
from fleetserve_operator.rollout.moves import (
    Step,
    Tick,
    advance,
    elapsed_s,
    new_event,
    passed,
    recorded,
    with_rollout,
)
from fleetserve_operator.spec import (
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutCommand,
    RolloutPhase,
    StepGate,
    StepGateStatus,
    StepPolicy,
    StepWait,
    Verdict,
    WebhookType,
    parse_duration_s,
)

__all__ = ["approve", "asks_confirmation", "gated_pass", "track_step_gate"]

P = RolloutPhase


def _policy(t: Tick, status: InferenceServiceStatus) -> StepPolicy | None:
    """The policy of the step `status` holds, if it holds one."""
    if not status.current_phase.is_analysing:
        return None
    return t.spec.rollout.policy_for(status.canary_weight)


def _gate(t: Tick, status: InferenceServiceStatus) -> StepGateStatus:
    """The step's recorded gate, or a fresh one starting now (a new step, a new rollout)."""
    rollout = status.rollout
    gate = rollout.step_gate
    if gate is not None and (gate.spec_hash, gate.step) == (rollout.spec_hash, rollout.step_index):
        return gate
    return StepGateStatus(
        spec_hash=rollout.spec_hash,
        step=rollout.step_index or 0,
        weight=status.canary_weight,
        started_at=t.stamp,
    )


def _with_gate(
    status: InferenceServiceStatus, gate: StepGateStatus | None
) -> InferenceServiceStatus:
    return status.model_copy(update=with_rollout(status, step_gate=gate))


def track_step_gate(t: Tick, status: InferenceServiceStatus) -> InferenceServiceStatus:
    """Keep `stepGate` for the step `status` holds: started with the step, gone without one.

    Runs after every row, so the step's hold counts from the call that gave it its weight.
    """
    if t.given is None:
        return status
    policy = _policy(t, status)
    if policy is None:
        return status if status.rollout.step_gate is None else _with_gate(status, None)
    gate = _gate(t, status)
    hold_until = None
    if policy.hold is not None:
        start = datetime.fromisoformat(gate.started_at)
        hold_until = rfc3339(start + timedelta(seconds=parse_duration_s(policy.hold)))
    gate = gate.model_copy(update={"hold_until": hold_until})
    return status if gate == status.rollout.step_gate else _with_gate(status, gate)


def _step_name(t: Tick) -> str:
    index, steps = t.status.rollout.step_index or 0, t.spec.rollout.steps
    return f"step {index + 1}/{len(steps)} ({t.status.canary_weight}%)"


def _wait(t: Tick, gate: StepGateStatus, waiting: StepWait, detail: str) -> Step:
    """Record the passing analysis and stay at the step, waiting for `waiting`."""
    since = gate.waiting_since if gate.waiting is waiting else t.stamp
    gate = gate.model_copy(update={"waiting": waiting, "waiting_since": since})
    message = f"{_step_name(t)} passed its analysis; {detail} since {since}"
    t = recorded(t, failed_analyses=0, inconclusive_analyses=0, step_gate=gate, message=message)
    status = t.status.model_copy(update={"phase": P.PROGRESSING})
    if since != t.stamp:
        return Step(status)
    reason = "StepHeld" if waiting is StepWait.HOLD else "AwaitingApproval"
    return Step(status, (new_event("Normal", reason, message),))


def asks_confirmation(
    spec: InferenceServiceSpec, before: InferenceServiceStatus, transition: Transition
) -> bool:
    """True when `transition` advances a step by itself and `confirm` webhooks must agree.

    A person's `promote` is not asked about: it is a decision already.
    """
    if not spec.rollout.webhooks_of(WebhookType.CONFIRM):
        return False
    if transition.trigger not in (Trigger.ANALYSIS_PASSED, Trigger.APPROVE):
        return False
    after = transition.status
    moved = after.rollout.step_index != before.rollout.step_index
    return after.current_phase is P.PROMOTING or (after.current_phase.is_analysing and moved)


def _confirmed(t: Tick) -> Step:
    """Advance, unless the `confirm` webhooks vetoed it: then record the pass and stay."""
    answer = t.facts.confirmation
    if answer is None or answer.allowed:
        return passed(t)
    message = f"{_step_name(t)} passed its analysis; advancing was vetoed: {answer.detail}"
    t = recorded(t, failed_analyses=0, inconclusive_analyses=0, message=message)
    status = t.status.model_copy(update={"phase": P.PROGRESSING})
    return Step(status, (new_event("Warning", "StepVetoed", message),))


def gated_pass(t: Tick) -> Step:
    """A passed analysis: advance, unless the step's hold or manual gate says wait."""
    policy = _policy(t, t.status)
    if policy is None:
        return _confirmed(t)
    gate = _gate(t, t.status)
    if policy.hold is not None and elapsed_s(gate.started_at, t.now) < parse_duration_s(
        policy.hold
    ):
        return _wait(t, gate, StepWait.HOLD, f"held until {gate.hold_until} (hold {policy.hold})")
    if policy.gate is StepGate.MANUAL and gate.approved_at is None:
        how = f"annotate {RolloutCommand.APPROVE.annotation}={t.status.canary_weight}"
        return _wait(t, gate, StepWait.AWAITING_APPROVAL, f"awaiting approval ({how})")
    return _confirmed(t)


def _weight(value: str) -> int | None:
    """The weight an `approve` value names (`1` or `1%`); None when it names none."""
    number = value.strip().removesuffix("%")
    return int(number) if number.isdigit() else None


def approve(t: Tick) -> Step:
    """The approve annotation: open the waiting step's gate, and advance if it just passed.

    An approval for a step that is not awaiting one is acknowledged as ignored. Paused, or
    when the last analysis did not pass, the approval is kept and the next pass advances.
    """
    value = t.facts.annotations.get(RolloutCommand.APPROVE.annotation, "")
    gate = t.status.rollout.step_gate
    waiting = gate is not None and gate.waiting is StepWait.AWAITING_APPROVAL
    if gate is None or not waiting:
        return Step(t.status, ignored=f"ignored: no step awaits approval in phase {t.phase}")
    if _weight(value) != gate.weight:
        why = f"ignored: the step awaiting approval is {gate.weight}%, not {value!r}"
        return Step(t.status, ignored=why)
    gate = gate.model_copy(update={"waiting": None, "waiting_since": None, "approved_at": t.stamp})
    message = f"{_step_name(t)} approved"
    t = replace(t, status=_with_gate(t.status, gate))
    event = new_event("Normal", "StepApproved", message)
    last = t.status.rollout.analyses[-1:]
    answer = t.facts.confirmation
    allowed = answer is None or answer.allowed
    if t.phase is P.PROGRESSING and last and last[0].verdict is Verdict.PASSED and allowed:
        step = advance(t)
        return Step(step.status, (event, *step.actions))
    if answer is not None and not answer.allowed:
        message = f"{message}; advancing was vetoed: {answer.detail}"
        event = new_event("Warning", "StepVetoed", message)
    status = t.status.model_copy(
        update=with_rollout(t.status, message=f"{message}; advancing at the next passing analysis")
    )
    return Step(status, (event,))
