"""The transition table and the driver: detect one trigger, run its row, finish the status.

`next_step` is the entry point (re-exported by `fleetserve_operator.rollout`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from fleetserve_operator.rollout.data import (
    Action,
    ClearAnnotation,
    Facts,
    TrackFacts,
    Transition,
    Trigger,
)
from fleetserve_operator.rollout.gates import approve, gated_pass, track_step_gate
from fleetserve_operator.rollout.moves import (
    Step,
    Tick,
    abort,
    adopt,
    bake_failed,
    bake_inconclusive,
    bake_passed,
    bake_promote_command,
    cancel,
    crashed,
    elapsed_s,
    failed,
    finish,
    ignored,
    inconclusive,
    new_event,
    not_ready,
    pause,
    pause_bake,
    promote_command,
    record_only,
    refuse,
    resume,
    resume_bake,
    settle,
    start,
    verdict,
    with_rollout,
)
from fleetserve_operator.rollout.notify import notifications
from fleetserve_operator.rollout.shadow import (
    canary_ready,
    shadow_failed,
    shadow_inconclusive,
    shadow_passed,
    shadow_skipped,
    with_shadow_evidence,
    without_ended_shadow,
)
from fleetserve_operator.rollout.traffic import fallback_active
from fleetserve_operator.spec import (
    Acknowledgement,
    Condition,
    ConditionType,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutCommand,
    RolloutPhase,
    Verdict,
    parse_duration_s,
    set_condition,
)

__all__ = ["TRANSITIONS", "next_step"]

P = RolloutPhase

_ANALYSING = (P.PROGRESSING, P.PAUSED, P.HOLDING)
_CANARY = (P.STARTING, P.SHADOWING, *_ANALYSING)
_SETTLED = (P.PENDING, P.SUCCEEDED)
_ENDED = (P.ROLLED_BACK, P.FAILED)
Handler = Callable[[Tick], Step]


def _rows(
    phases: tuple[RolloutPhase, ...], trigger: Trigger, handler: Handler
) -> dict[Any, Handler]:
    return {(phase, trigger): handler for phase in phases}


_BAKE_ROWS: dict[Trigger, Handler] = {
    Trigger.NEW_SPEC: start,
    Trigger.SPEC_REVERTED: cancel,
    Trigger.ABORT: abort,
    Trigger.CANARY_CRASHED: crashed,
    Trigger.PROMOTE: bake_promote_command,
    Trigger.PAUSE: pause_bake,
    Trigger.RESUME: resume_bake,
    Trigger.ANALYSIS_PASSED: bake_passed,
    Trigger.ANALYSIS_FAILED: bake_failed,
    Trigger.ANALYSIS_INCONCLUSIVE: bake_inconclusive,
}
"""The `Baking` rows: the canary carries all traffic, the previous version is on standby.
Rolling back (abort, a crash, a failed analysis) is the usual withdrawal: the weights go
back to the stable track, which still runs the previous spec."""

_SHADOW_ROWS: dict[Trigger, Handler] = {
    Trigger.PROMOTE: shadow_skipped,
    Trigger.ANALYSIS_PASSED: shadow_passed,
    Trigger.ANALYSIS_FAILED: shadow_failed,
    Trigger.ANALYSIS_INCONCLUSIVE: shadow_inconclusive,
}
"""The `Shadowing` rows beyond those of every canary phase (a new or reverted spec, abort,
a crash): the canary at weight 0, judged on the copies the stable pods send it. Pause and
resume do not apply (the stage ends at `maxDuration` whatever happens)."""

TRANSITIONS: dict[tuple[RolloutPhase, Trigger], Handler] = {
    **_rows(tuple(RolloutPhase), Trigger.SPEC_INVALID, refuse),
    **_rows((*_SETTLED, *_ENDED), Trigger.ADOPT, adopt),
    **_rows((*_SETTLED, *_ENDED, *_CANARY), Trigger.NEW_SPEC, start),
    **_rows(_CANARY, Trigger.SPEC_REVERTED, cancel),
    **_rows(_ENDED, Trigger.SPEC_REVERTED, settle),
    **_rows(_CANARY, Trigger.ABORT, abort),
    **_rows(_CANARY, Trigger.CANARY_CRASHED, crashed),
    **_rows(_ENDED, Trigger.RETRY, start),
    **_rows(_ANALYSING, Trigger.PROMOTE, promote_command),
    **_rows((P.PROGRESSING, P.HOLDING), Trigger.PAUSE, pause),
    **_rows((P.PAUSED, P.HOLDING), Trigger.RESUME, resume),
    **_rows(_ANALYSING, Trigger.APPROVE, approve),
    (P.STARTING, Trigger.CANARY_READY): canary_ready,
    (P.STARTING, Trigger.READY_DEADLINE_PASSED): not_ready,
    **_rows((P.PROGRESSING, P.HOLDING), Trigger.ANALYSIS_PASSED, gated_pass),
    (P.PAUSED, Trigger.ANALYSIS_PASSED): record_only,
    **_rows(_ANALYSING, Trigger.ANALYSIS_FAILED, failed),
    **_rows((P.PROGRESSING, P.HOLDING), Trigger.ANALYSIS_INCONCLUSIVE, inconclusive),
    (P.PAUSED, Trigger.ANALYSIS_INCONCLUSIVE): record_only,
    (P.PROMOTING, Trigger.STABLE_PROMOTED): finish,
    (P.PENDING, Trigger.STABLE_AVAILABLE): settle,
    (P.SUCCEEDED, Trigger.STABLE_UNAVAILABLE): settle,
    **{(P.BAKING, trigger): handler for trigger, handler in _BAKE_ROWS.items()},
    **{(P.SHADOWING, trigger): handler for trigger, handler in _SHADOW_ROWS.items()},
}
"""(phase, trigger) → handler. A pair not listed leaves the status as it is."""


def _command_value(t: Tick, command: RolloutCommand) -> str | None:
    """The command's annotation value, unless that value was already acted on."""
    value = t.facts.annotations.get(command.annotation)
    acted = {(a.annotation, a.value) for a in t.status.rollout.acknowledged}
    return None if value is None or (command.annotation, value) in acted else value


def _canary_crashed(t: Tick) -> bool:
    canary = t.facts.canary
    current = canary is not None and canary.spec_hash == t.status.rollout.spec_hash
    return (
        current
        and canary is not None
        and (canary.oom_killed or canary.restarts > 0 or canary.fetch_failure is not None)
    )


def _serves(track: TrackFacts | None, spec_hash: str | None) -> bool:
    return track is not None and track.serves(spec_hash)


def _adoptable(t: Tick) -> bool:
    stable_hash = t.status.rollout.stable_hash
    first = t.phase is P.PENDING and t.status.stable_version is None
    return stable_hash is None or (first and t.spec_hash != stable_hash)


_DETECT: dict[Trigger, Callable[[Tick], bool]] = {
    Trigger.SPEC_INVALID: lambda t: t.given is None,
    Trigger.ADOPT: _adoptable,
    Trigger.NEW_SPEC: lambda t: (
        t.spec_hash not in (t.status.rollout.stable_hash, t.status.rollout.spec_hash)
    ),
    Trigger.SPEC_REVERTED: lambda t: (
        t.spec_hash == t.status.rollout.stable_hash != t.status.rollout.spec_hash
    ),
    Trigger.CANARY_CRASHED: _canary_crashed,
    Trigger.CANARY_READY: lambda t: _serves(t.facts.canary, t.status.rollout.spec_hash),
    Trigger.READY_DEADLINE_PASSED: lambda t: (
        elapsed_s(t.status.rollout.canary_started_at, t.now)
        >= parse_duration_s(t.spec.rollout.progress_deadline)
    ),
    Trigger.ANALYSIS_PASSED: lambda t: verdict(t) is Verdict.PASSED,
    Trigger.ANALYSIS_FAILED: lambda t: verdict(t) is Verdict.FAILED,
    Trigger.ANALYSIS_INCONCLUSIVE: lambda t: verdict(t) is Verdict.INCONCLUSIVE,
    Trigger.STABLE_PROMOTED: lambda t: _serves(t.facts.stable, t.status.rollout.stable_hash),
    Trigger.STABLE_AVAILABLE: lambda t: _serves(t.facts.stable, t.status.rollout.stable_hash),
    Trigger.STABLE_UNAVAILABLE: lambda t: not _serves(t.facts.stable, t.status.rollout.stable_hash),
}


def _detect(t: Tick) -> Trigger | None:
    """The first trigger, in priority order, that has a row (or is a command) and holds."""
    for trigger in Trigger:
        command = trigger.command
        if command is not None:
            if _command_value(t, command) is not None:
                return trigger
        elif (t.phase, trigger) in TRANSITIONS and _DETECT[trigger](t):
            return trigger
    return None


def _run(t: Tick, trigger: Trigger) -> Step:
    """Run the row for `trigger`; a command is acknowledged whether it applied or not."""
    handler = TRANSITIONS.get((t.phase, trigger), ignored)
    step = handler(t)
    command = trigger.command
    if command is None:
        return step
    value = _command_value(t, command) or ""
    before, after = t.phase.value, step.status.current_phase.value
    applied = handler is not ignored and step.ignored is None
    result = f"{before} -> {after}" if applied else step.ignored or f"ignored in phase {before}"
    ack = Acknowledgement(annotation=command.annotation, value=value, time=t.stamp, result=result)
    kept = [a for a in step.status.rollout.acknowledged if a.annotation != command.annotation]
    status = step.status.model_copy(update=with_rollout(step.status, acknowledged=[*kept, ack]))
    event = new_event(
        "Normal" if applied else "Warning",
        "CommandAcknowledged" if applied else "CommandIgnored",
        f"{command.annotation}={value}: {result}",
    )
    return Step(status, (*step.actions, event))


def _gpu_down(t: Tick) -> tuple[str, str] | None:
    """Why the GPU tracks cannot serve (reason, message), or None when they can.

    The canary counts while it carries weight: with `maxSurgeGPUs` the stable track may be
    scaled to 0 at the 100% step, and that is not an outage.
    """
    fallback, stable, canary = t.spec.fallback, t.facts.stable, t.facts.canary
    available = stable.available if stable else 0
    if t.phase.is_rollout_active and t.status.canary_weight > 0 and canary is not None:
        available += canary.available
    if available == 0:
        return "StableUnavailable", "the GPU tracks have no available replica"
    ratio, limit = t.facts.stable_error_ratio, fallback.max_error_rate
    if limit is not None and ratio is not None and ratio > limit:
        return "StableErrorRate", (
            f"stable 5xx ratio {ratio:.4g} > fallback.maxErrorRate {limit} "
            f"over {fallback.error_window}"
        )
    return None


def _fail_over(t: Tick) -> tuple[Tick, tuple[Action, ...]]:
    """Switch traffic to the CPU fallback and back; the interval restarts on the way back.

    Right after a failover the stable's error window still holds the errors that caused
    it, so the way back waits about one `errorWindow`: a built-in hysteresis. A refused
    spec says nothing about the tracks: the traffic stays where it is.
    """
    if t.given is None:
        return t, ()
    down = _gpu_down(t) if t.spec.fallback.enabled else None
    if (down is not None) == fallback_active(t.status):
        return t, ()
    reason, message = down or ("GPUTrackServing", "the GPU tracks serve again")
    condition = Condition(
        type=ConditionType.FALLBACK_ACTIVE.value,
        status="True" if down else "False",
        last_transition_time=t.stamp,
        reason=reason,
        message=message,
    )
    update: dict[str, Any] = {
        "conditions": set_condition(t.status.conditions, condition, now=t.stamp)
    }
    if down is None and t.phase.is_analysing:
        update |= with_rollout(t.status, interval_started_at=t.stamp)
    name = "FallbackActivated" if down else "FallbackDeactivated"
    event = new_event("Warning" if down else "Normal", name, message)
    return replace(t, status=t.status.model_copy(update=update)), (event,)


def _with_evidence(t: Tick) -> Tick:
    """Keep the sequential tests' (or the shadow stage's) new evidence, whatever the step does."""
    if t.given is None:
        return t
    status = with_shadow_evidence(t.status, t.facts.shadow_evidence)
    evidence = t.facts.evidence
    if evidence is not None:
        status = status.model_copy(update=with_rollout(status, evidence=evidence))
    return replace(t, status=status)


def _forget_gone_commands(t: Tick) -> Tick:
    """Drop acknowledgements of removed annotations, so the same value can be sent again."""
    acks = t.status.rollout.acknowledged
    kept = [a for a in acks if a.annotation in t.facts.annotations]
    if kept == acks:
        return t
    return replace(t, status=t.status.model_copy(update=with_rollout(t.status, acknowledged=kept)))


def _finalise(before: Tick, status: InferenceServiceStatus) -> Step:
    """Stamp the phase change, set `Promoted`, and clear the command annotations acted on."""
    now = before.stamp
    phase = status.current_phase
    changed = phase is not before.status.phase
    promoted = Condition(
        type=ConditionType.PROMOTED.value,
        status="True" if phase is P.SUCCEEDED else "False",
        last_transition_time=now,
        reason=phase.value,
        message=status.rollout.message,
    )
    status = status.model_copy(
        update={
            "phase": phase,
            "last_transition_time": now if changed else before.status.last_transition_time,
            "conditions": set_condition(status.conditions, promoted, now=now),
        }
    )
    present = before.facts.annotations
    cleared = tuple(
        ClearAnnotation(a.annotation)
        for a in status.rollout.acknowledged
        if present.get(a.annotation) == a.value
    )
    return Step(status, cleared)


def _without_ended_bake(status: InferenceServiceStatus) -> InferenceServiceStatus:
    """`status.rollout.bake` is kept only while Baking: any move out of it ends the bake."""
    if status.rollout.bake is None or status.current_phase is P.BAKING:
        return status
    return status.model_copy(update=with_rollout(status, bake=None))


def next_step(
    spec: InferenceServiceSpec | None,
    status: InferenceServiceStatus,
    facts: Facts,
    now: datetime,
) -> Transition:
    """Decide the rollout's next move; the caller renders `status`, then applies `actions`.

    The children (canary, stable spec, weights, replicas) follow from the status alone.

    Args:
        spec: The parsed spec (never rewritten); None when it was refused as invalid,
            which fails the rollout (the `SpecInvalid` row) and moves nothing else.
        status: The object's current status; all rollout state comes from here.
        facts: What was observed now (tracks, annotations, the due analysis).
        now: The clock (timezone-aware).

    Returns:
        The new status and the side effects, in order; with no trigger, at most a
        failover's Event and the clearing of command annotations already acted on.
    """
    before = Tick(spec, status, facts, now, None if spec is None else spec.gpu_track.digest)
    t, fallback_actions = _fail_over(_with_evidence(before))
    t = _forget_gone_commands(t)
    trigger = _detect(t)
    step = _run(t, trigger) if trigger is not None else Step(t.status)
    ended = without_ended_shadow(_without_ended_bake(step.status))
    done = _finalise(before, track_step_gate(t, ended))
    actions = (*fallback_actions, *step.actions, *done.actions)
    actions = (*actions, *notifications(spec, status, done.status, actions))
    return Transition(status=done.status, actions=actions, trigger=trigger)
