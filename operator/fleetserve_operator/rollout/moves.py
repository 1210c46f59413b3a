"""The moves of the rollout: one handler per row of `machine.TRANSITIONS`.

Each handler takes the `Tick` (spec, status, facts, clock) and returns a `Step`: the new
status and its side effects (Events, counters). The canary, the stable track's spec, the
weights and the replica counts are not actions: `render` renders them from the status.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from fleetserve_operator.records import EventNote, rfc3339
from fleetserve_operator.rollout.data import (
    Action,
    Facts,
    IncrementCounter,
    OperatorCounter,
    TrackFacts,
)
from fleetserve_operator.rollout.traffic import fallback_active
from fleetserve_operator.spec import (
    AnalysisResult,
    BakeStatus,
    CheckOutcome,
    InconclusiveReason,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutCommand,
    RolloutPhase,
    Verdict,
    parse_duration_s,
)

P = RolloutPhase


@dataclass(frozen=True, slots=True)
class Tick:
    """One call of `next_step`: its inputs, and the spec's digest computed once.

    `given` is None when the object's spec was refused as invalid: then only the
    `SpecInvalid` row runs, and it reads no spec.
    """

    given: InferenceServiceSpec | None
    status: InferenceServiceStatus
    facts: Facts
    now: datetime
    spec_hash: str | None

    @property
    def spec(self) -> InferenceServiceSpec:
        """The parsed spec, which every row but `SpecInvalid`'s has."""
        assert self.given is not None, "only the SpecInvalid row runs without a spec"
        return self.given

    @property
    def phase(self) -> RolloutPhase:
        """The current phase; a fresh object counts as Pending."""
        return self.status.current_phase

    @property
    def stamp(self) -> str:
        """`now` as metav1 writes timestamps (RFC 3339, UTC, seconds)."""
        return rfc3339(self.now)


@dataclass(frozen=True, slots=True)
class Step:
    """A handler's result: the new status and the actions it alone knows about."""

    status: InferenceServiceStatus
    actions: tuple[Action, ...] = ()
    ignored: str | None = None
    """Why a command's row did not apply it (acknowledged as ignored, with this reason)."""


def elapsed_s(since: str | None, now: datetime) -> float:
    """Seconds from the timestamp `since` to `now`; -inf when it was never set."""
    return -math.inf if since is None else (now - datetime.fromisoformat(since)).total_seconds()


def is_watching(status: InferenceServiceStatus) -> bool:
    """True while the canary holds a step and failover is off: sequential mode looks."""
    return status.current_phase.is_analysing and not fallback_active(status)


def is_analysis_due(
    spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime
) -> bool:
    """True when the canary holds a step, failover is off, and an interval has passed."""
    if not is_watching(status):
        return False
    elapsed = elapsed_s(status.rollout.interval_started_at, now)
    return elapsed >= parse_duration_s(spec.rollout.interval)


def is_shadow_due(
    spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime
) -> bool:
    """True while shadowing, failover off, and an interval has passed: the stage is judged.

    Failover sends the traffic to the CPU track: the stable pods copy nothing then.
    """
    if status.current_phase is not P.SHADOWING or fallback_active(status):
        return False
    elapsed = elapsed_s(status.rollout.interval_started_at, now)
    return elapsed >= parse_duration_s(spec.rollout.interval)


def with_rollout(status: InferenceServiceStatus, **changes: Any) -> dict[str, Any]:
    """A status update that changes these `status.rollout` fields."""
    return {"rollout": status.rollout.model_copy(update=changes)}


def settled_phase(t: Tick, stable_hash: str | None) -> RolloutPhase:
    """Without a rollout: Succeeded while stable serves `stable_hash`, else Pending."""
    stable = t.facts.stable
    return P.SUCCEEDED if stable is not None and stable.serves(stable_hash) else P.PENDING


def new_event(kind: Literal["Normal", "Warning"], reason: str, message: str) -> EventNote:
    """An Event to post on the InferenceService."""
    return EventNote(type=kind, reason=reason, message=message)


# Handlers: one per row of TRANSITIONS; each returns the new status and its own actions.


def refuse(t: Tick) -> Step:
    """The spec was refused as invalid: Failed until a new spec; the rollout state is kept."""
    return Step(t.status.model_copy(update={"phase": P.FAILED}))


def adopt(t: Tick) -> Step:
    """First deploy (or first sight): the spec becomes stable's, with no canary."""
    gpu = t.spec.gpu_track
    phase = settled_phase(t, gpu.digest)
    update: dict[str, Any] = {"phase": phase} | with_rollout(
        t.status, stable_spec=gpu, stable_hash=gpu.digest, spec_hash=None, message=""
    )
    # As `settle` does: the next rollout's analysis finds stable's series by this version.
    if phase is P.SUCCEEDED:
        update["stable_version"] = gpu.model.version
    return Step(t.status.model_copy(update=update))


def settle(t: Tick) -> Step:
    """No rollout: Succeeded while stable serves its spec, else Pending."""
    stable_spec = t.status.rollout.stable_spec
    phase = settled_phase(t, t.status.rollout.stable_hash)
    update: dict[str, Any] = {"phase": phase} | with_rollout(t.status, spec_hash=None, message="")
    if phase is P.SUCCEEDED and stable_spec is not None:
        update["stable_version"] = stable_spec.model.version
    return Step(t.status.model_copy(update=update))


def start(t: Tick) -> Step:
    """(Re)start a rollout of the current spec: canary at weight 0 until it is Ready."""
    version, digest = t.spec.model.version, t.spec_hash
    reason = "RolloutRestarted" if t.phase.is_rollout_active else "RolloutStarted"
    message = f"rolling out version {version} (spec {digest}) over steps {t.spec.rollout.steps}"
    status = t.status.model_copy(
        update={"phase": P.STARTING, "canary_version": version, "canary_weight": 0}
        | with_rollout(
            t.status,
            spec_hash=digest,
            step_index=None,
            canary_started_at=t.stamp,
            interval_started_at=None,
            failed_analyses=0,
            inconclusive_analyses=0,
            analyses=[],
            evidence=None,
            message=f"waiting for the canary to become Ready: {message}",
        )
    )
    return Step(status, (new_event("Normal", reason, message),))


def withdraw(t: Tick, phase: RolloutPhase, message: str, **changes: Any) -> Step:
    """End the rollout in `phase`: the canary goes and its weight is 0."""
    update: dict[str, Any] = {"phase": phase, "canary_version": None, "canary_weight": 0}
    status = t.status.model_copy(update=update | with_rollout(t.status, message=message, **changes))
    return Step(status)


def cancel(t: Tick) -> Step:
    """The spec went back to stable's: drop the canary; nothing failed."""
    phase = settled_phase(t, t.status.rollout.stable_hash)
    step = withdraw(t, phase, "", spec_hash=None, step_index=None)
    event = new_event("Normal", "RolloutCancelled", "the spec is the stable one again")
    return Step(step.status, (*step.actions, event))


def roll_back(t: Tick, reason: str, detail: str, phase: RolloutPhase = P.ROLLED_BACK) -> Step:
    """Weight 0 at once, canary removed; the failed spec is kept so it is not retried alone."""
    version = t.status.canary_version
    message = f"{reason}: version {version} withdrawn at {t.status.canary_weight}%: {detail}"
    step = withdraw(t, phase, message, step_index=None)
    counter = IncrementCounter(OperatorCounter.ROLLBACKS, reason)
    return Step(step.status, (*step.actions, counter, new_event("Warning", phase.value, message)))


def abort(t: Tick) -> Step:
    """The abort annotation: roll back now."""
    return roll_back(t, "Aborted", "the abort annotation was set")


def crashed(t: Tick) -> Step:
    """A canary's model fetch failed or a container died: roll back without waiting for PromQL."""
    canary = t.facts.canary or TrackFacts(spec_hash=None)
    if canary.fetch_failure is not None:
        return roll_back(t, *canary.fetch_failure)
    if canary.oom_killed:
        return roll_back(t, "CanaryOOMKilled", "a canary container was OOMKilled")
    return roll_back(t, "CanaryRestarted", f"canary containers restarted {canary.restarts}x")


def not_ready(t: Tick) -> Step:
    """The canary missed `progressDeadline`: the rollout failed (its weight was never > 0)."""
    deadline = t.spec.rollout.progress_deadline
    detail = f"the canary did not become Ready within progressDeadline {deadline}"
    return roll_back(t, "CanaryNotReady", detail, phase=P.FAILED)


def _fresh_interval(t: Tick, **fields: Any) -> dict[str, Any]:
    """`with_rollout` for a new analysis interval (a step's, or the bake's), with `fields`.

    The tests run on over the whole rollout; an interval's sample size starts afresh.
    """
    evidence = t.status.rollout.evidence
    return with_rollout(
        t.status,
        interval_started_at=t.stamp,
        failed_analyses=0,
        inconclusive_analyses=0,
        evidence=evidence and evidence.model_copy(update={"step_samples": 0.0, "step_tokens": 0.0}),
        **fields,
    )


def at_step(t: Tick, index: int, reason: str) -> Step:
    """Hold step `index` for a fresh interval."""
    weight = t.spec.rollout.steps[index]
    message = f"step {index + 1}/{len(t.spec.rollout.steps)}: {weight}% to the canary"
    status = t.status.model_copy(
        update={"phase": P.PROGRESSING, "canary_weight": weight}
        | _fresh_interval(t, step_index=index, message=message)
    )
    return Step(status, (new_event("Normal", reason, message),))


def first_step(t: Tick) -> Step:
    """The canary is Ready: give it the first step's weight."""
    return at_step(t, 0, "CanaryReady")


def promote(t: Tick) -> Step:
    """The last step passed: stable rolls to the new spec while the canary takes it all."""
    gpu = t.spec.gpu_track
    message = f"stable track rolling to version {gpu.model.version}; canary carries 100%"
    status = t.status.model_copy(
        update={"phase": P.PROMOTING, "canary_weight": 100}
        | with_rollout(t.status, stable_spec=gpu, stable_hash=gpu.digest, message=message)
    )
    return Step(status, (new_event("Normal", "Promoting", message),))


def advance(t: Tick, reason: str = "StepAdvanced") -> Step:
    """The next step, or promotion after the last."""
    following = (t.status.rollout.step_index or 0) + 1
    if following < len(t.spec.rollout.steps):
        return at_step(t, following, reason)
    return start_bake(t) if t.spec.rollout.bake is not None else promote(t)


def promote_command(t: Tick) -> Step:
    """The promote annotation: `full` promotes now, any other value takes the next step."""
    value = t.facts.annotations.get(RolloutCommand.PROMOTE.annotation, "")
    return promote(t) if value.strip().lower() == "full" else advance(t, "PromotedByHand")


def finish(t: Tick) -> Step:
    """Stable serves the new spec: traffic back to it, canary gone."""
    version = t.status.canary_version
    step = withdraw(t, P.SUCCEEDED, "", spec_hash=None, step_index=None)
    status = step.status.model_copy(update={"stable_version": version})
    counter = IncrementCounter(OperatorCounter.PROMOTIONS, "Promoted")
    event = new_event("Normal", "Promoted", f"version {version} is stable")
    return Step(status, (*step.actions, counter, event))


def pause(t: Tick) -> Step:
    """The pause annotation: hold the weight (analysis still runs and can roll back)."""
    message = f"paused by annotation at {t.status.canary_weight}%"
    return Step(
        t.status.model_copy(update={"phase": P.PAUSED} | with_rollout(t.status, message=message))
    )


def resume(t: Tick) -> Step:
    """The resume annotation: continue with a fresh interval and no inconclusive count."""
    message = f"resumed at {t.status.canary_weight}%"
    update = with_rollout(
        t.status, interval_started_at=t.stamp, inconclusive_analyses=0, message=message
    )
    return Step(t.status.model_copy(update={"phase": P.PROGRESSING} | update))


def due_analysis(t: Tick) -> AnalysisResult:
    """The due analysis: the caller's result, a pass without analysis config, else NotRun.

    A shadow stage never passes without a result: its agreement must be shown.
    """
    if t.facts.analysis is not None:
        return t.facts.analysis
    if t.spec.rollout.analysis is None and t.phase is not P.SHADOWING:
        message = "no analysis configured: judged on readiness and time alone"
        return AnalysisResult(verdict=Verdict.PASSED, message=message)
    return AnalysisResult(
        verdict=Verdict.INCONCLUSIVE,
        reason=InconclusiveReason.NOT_RUN,
        message="the analysis was due but no result was supplied",
    )


def verdict(t: Tick) -> Verdict | None:
    """The due analysis's verdict; None when no analysis is due.

    A Failed result acts before the interval is over: a sequential test rejected.
    """
    if is_analysis_due(t.spec, t.status, t.now) or is_shadow_due(t.spec, t.status, t.now):
        return due_analysis(t).verdict
    early = t.facts.analysis
    return Verdict.FAILED if early is not None and early.verdict is Verdict.FAILED else None


def recorded(t: Tick, **changes: Any) -> Tick:
    """`t` with the due analysis appended to the history and a fresh interval."""
    result = due_analysis(t).model_copy(update={"time": t.stamp, "weight": t.status.canary_weight})
    limit = t.spec.rollout.analysis.history_limit if t.spec.rollout.analysis else 10
    history = [*t.status.rollout.analyses, result][-limit:]
    update = with_rollout(t.status, analyses=history, interval_started_at=t.stamp, **changes)
    return replace(t, status=t.status.model_copy(update=update))


def counted_inconclusive(t: Tick) -> tuple[Tick, int, str]:
    """`t` with its due analysis recorded as one more inconclusive in a row.

    Also the count in a row, and why there was no verdict: the reason, the analysis's message.
    """
    result = due_analysis(t)
    count = t.status.rollout.inconclusive_analyses + 1
    reason = result.reason.value if result.reason else "Inconclusive"
    return recorded(t, inconclusive_analyses=count), count, f"{reason}: {result.message}"


def passed(t: Tick) -> Step:
    """A passed analysis: record it and advance (out of Holding too)."""
    return advance(recorded(t))


def record_only(t: Tick) -> Step:
    """While paused a pass or no verdict changes nothing but the history."""
    return Step(recorded(t).status)


def failed(t: Tick) -> Step:
    """Count a failed analysis; `failureThreshold` in a row rolls the canary back.

    A sequential test's rejection is conclusive at level α: it rolls back at once.
    """
    result, analysis = due_analysis(t), t.spec.rollout.analysis
    failures = t.status.rollout.failed_analyses + 1
    threshold = analysis.failure_threshold if analysis else 1
    t = recorded(t, failed_analyses=failures, inconclusive_analyses=0)
    if any(check.outcome is CheckOutcome.REJECTED for check in result.checks):
        rejected = new_event("Warning", "AnalysisRejected", result.message)
        step = roll_back(t, "AnalysisRejected", result.message)
        return Step(step.status, (rejected, *step.actions))
    detail = f"{result.message} ({failures}/{threshold} consecutive failed analyses)"
    if failures >= threshold:
        return roll_back(t, "AnalysisFailed", detail)
    status = t.status.model_copy(update=with_rollout(t.status, message=detail))
    return Step(status, (new_event("Warning", "AnalysisFailed", detail),))


HOLDING_FOR_EVIDENCE = "holding for evidence"


def hold_for_evidence(t: Tick, result: AnalysisResult) -> Step:
    """Hold the step until the power gates clear, or roll back `progressDeadline` after it.

    The deadline counts from the end of the interval.
    The analysis stays due at every look (the interval is not restarted, nothing is
    counted or kept in the history); status says what the evidence has and needs, and an
    Event marks the start of the hold.
    """
    rollout_spec = t.spec.rollout
    deadline = rollout_spec.progress_deadline
    waited = elapsed_s(t.status.rollout.interval_started_at, t.now)
    if waited - parse_duration_s(rollout_spec.interval) >= parse_duration_s(deadline):
        detail = (
            f"the evidence did not suffice within progressDeadline {deadline} after the "
            f"interval: {result.message}"
        )
        return roll_back(t, "ProgressDeadlineExceeded", detail)
    detail = (
        f"{HOLDING_FOR_EVIDENCE} at {t.status.canary_weight}% (at most progressDeadline "
        f"{deadline} after the interval): {result.message}"
    )
    update = {"phase": P.HOLDING} | with_rollout(t.status, message=detail)
    status = t.status.model_copy(update=update)
    if t.phase is P.HOLDING and t.status.rollout.message.startswith(HOLDING_FOR_EVIDENCE):
        return Step(status)
    return Step(status, (new_event("Normal", "HoldingForEvidence", detail),))


def inconclusive(t: Tick) -> Step:
    """Count an analysis without verdict; `inconclusiveThreshold` in a row holds the step.

    Too little evidence at a gated step is not counted: the step holds for it at once.
    """
    result, analysis = due_analysis(t), t.spec.rollout.analysis
    if result.reason is InconclusiveReason.INSUFFICIENT_EVIDENCE:
        return hold_for_evidence(t, result)
    threshold = analysis.inconclusive_threshold if analysis else 1
    t, count, why = counted_inconclusive(t)
    detail = f"{why} ({count}/{threshold} inconclusive analyses)"
    phase = P.HOLDING if count >= threshold else t.phase
    if phase is P.HOLDING:
        detail = f"holding at {t.status.canary_weight}%, never promoting without data: {detail}"
    status = t.status.model_copy(update={"phase": phase} | with_rollout(t.status, message=detail))
    return Step(status, (new_event("Warning", "AnalysisInconclusive", detail),))


def ignored(t: Tick) -> Step:
    """A command with no row for the phase: nothing changes (it is still acknowledged)."""
    return Step(t.status)


# The bake: the last step passed, the canary carries all traffic, stable is its hot standby.


def start_bake(t: Tick) -> Step:
    """The last step passed with `rollout.bake` set: bake at 100%, stable kept at weight 0.

    The stable track keeps the previous spec (no promotion yet), so taking the traffic back
    is a change of weights. The bake is judged as a step: a fresh interval and sample count,
    the evidence (and stable's baseline) kept.
    """
    bake = t.spec.rollout.bake or "0s"
    until = rfc3339(t.now + timedelta(seconds=parse_duration_s(bake)))
    standby = t.status.stable_version
    message = (
        f"baking version {t.status.canary_version} at 100% until {until} (bake {bake}); "
        f"version {standby} on hot standby at weight 0"
    )
    state = BakeStatus(since=t.stamp, until=until, standby_version=standby)
    status = t.status.model_copy(
        update={"phase": P.BAKING, "canary_weight": 100}
        | _fresh_interval(t, bake=state, message=message)
    )
    return Step(status, (new_event("Normal", "Baking", message),))


def end_bake(t: Tick, reason: str, detail: str) -> Step:
    """The bake is over: the normal promotion runs (the stable track takes the new spec)."""
    step = promote(t)
    return Step(step.status, (new_event("Normal", reason, detail), *step.actions))


def bake_passed(t: Tick) -> Step:
    """A passed analysis: the bake ends at the first one at or after its end, unless paused."""
    bake = t.status.rollout.bake
    t = recorded(t, failed_analyses=0, inconclusive_analyses=0)
    if bake is None or bake.paused or elapsed_s(bake.until, t.now) < 0:
        return Step(t.status)
    detail = f"version {t.status.canary_version} passed its bake since {bake.since}"
    return end_bake(t, "BakeCompleted", detail)


def bake_promote_command(t: Tick) -> Step:
    """The promote annotation during the bake: end it now, whatever its value."""
    return end_bake(t, "BakeEndedByHand", "the promote annotation ended the bake early")


def bake_failed(t: Tick) -> Step:
    """Any failed analysis during the bake flips the traffic back to the standby at once.

    The canary already served everyone: a failure is not waited out (`failureThreshold`),
    and in sequential mode it is a test's rejection at level α, or a PromQL check's bound.
    """
    result = due_analysis(t)
    rejected = any(check.outcome is CheckOutcome.REJECTED for check in result.checks)
    reason = "AnalysisRejected" if rejected else "AnalysisFailed"
    t = recorded(t, failed_analyses=t.status.rollout.failed_analyses + 1)
    step = roll_back(t, reason, f"during the bake: {result.message}")
    return Step(step.status, (new_event("Warning", reason, result.message), *step.actions))


def bake_inconclusive(t: Tick) -> Step:
    """No verdict during the bake: counted and reported; the bake cannot end on it."""
    t, count, why = counted_inconclusive(t)
    detail = (
        f"baking at 100%, never promoting without data: {why} "
        f"({count} inconclusive analyses in a row)"
    )
    status = t.status.model_copy(update=with_rollout(t.status, message=detail))
    return Step(status, (new_event("Warning", "AnalysisInconclusive", detail),))


def _bake_flag(t: Tick, message: str, *, paused: bool, **changes: Any) -> Step:
    bake = t.status.rollout.bake
    state = bake and bake.model_copy(update={"paused": paused})
    update = with_rollout(t.status, bake=state, message=message, **changes)
    return Step(t.status.model_copy(update=update))


def pause_bake(t: Tick) -> Step:
    """The pause annotation during the bake: it goes on (analysis, standby) but never ends."""
    return _bake_flag(t, "bake paused by annotation: baking until resumed", paused=True)


def resume_bake(t: Tick) -> Step:
    """The resume annotation during the bake: it may end again, after a fresh interval."""
    until = t.status.rollout.bake.until if t.status.rollout.bake else "its end"
    message = f"bake resumed: it ends at the first passing analysis from {until}"
    return _bake_flag(t, message, paused=False, interval_started_at=t.stamp)
