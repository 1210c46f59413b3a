"""The rows of the shadow stage: the canary at weight 0, judged on copies of live requests.

With `rollout.shadow` set, a canary that became Ready does not take the first step at once:
it enters `Shadowing`. The stable pods copy a sample of their requests to it (`render`
writes the target into the ConfigMap they follow), and at every `rollout.interval` the
caller's `analysis.agreement` verdict decides: Passed takes the first step, Failed rolls the
canary back with the measured agreement in its reason, and Inconclusive waits, until
`maxDuration` rolls it back as a step that waited too long for its evidence is. Leaving
the phase, by any row, ends the stage: the status loses `rollout.shadow`, so the ConfigMap
is emptied and the stable pods stop copying.
"""

from __future__ import annotations

from datetime import timedelta

from fleetserve_operator.records import rfc3339
from fleetserve_operator.rollout.moves import (
    Step,
    Tick,
    at_step,
    counted_inconclusive,
    due_analysis,
    elapsed_s,
    first_step,
    new_event,
    recorded,
    roll_back,
    with_rollout,
)
from fleetserve_operator.spec import (
    InferenceServiceStatus,
    RolloutPhase,
    ShadowEvidence,
    ShadowStatus,
    parse_duration_s,
)

__all__ = [
    "canary_ready",
    "shadow_failed",
    "shadow_inconclusive",
    "shadow_passed",
    "shadow_skipped",
    "with_shadow_evidence",
    "without_ended_shadow",
]

P = RolloutPhase


def _start_shadow(t: Tick) -> Step:
    """Shadow the canary: weight 0, the stable pods told to copy, a fresh interval."""
    shadow = t.spec.rollout.shadow
    assert shadow is not None, "only a spec with rollout.shadow shadows"
    until = rfc3339(t.now + timedelta(seconds=parse_duration_s(shadow.max_duration)))
    message = (
        f"shadowing version {t.status.canary_version} at weight 0: the stable pods copy "
        f"{shadow.fraction:g} of their requests to it, judged every {t.spec.rollout.interval} "
        f"until {until} (maxDuration {shadow.max_duration})"
    )
    status = t.status.model_copy(
        update={"phase": P.SHADOWING, "canary_weight": 0}
        | with_rollout(
            t.status,
            shadow=ShadowStatus(since=t.stamp, until=until),
            interval_started_at=t.stamp,
            failed_analyses=0,
            inconclusive_analyses=0,
            message=message,
        )
    )
    return Step(status, (new_event("Normal", "ShadowStarted", message),))


def canary_ready(t: Tick) -> Step:
    """The canary is Ready: the shadow stage when `rollout.shadow` is set, else the first step."""
    return _start_shadow(t) if t.spec.rollout.shadow is not None else first_step(t)


def shadow_passed(t: Tick) -> Step:
    """The canary was shown to agree: the stage ends and the first step begins."""
    result = due_analysis(t)
    t = recorded(t)
    step = at_step(t, 0, "StepAdvanced")
    detail = f"version {t.status.canary_version} passed its shadow stage: {result.message}"
    return Step(step.status, (new_event("Normal", "ShadowPassed", detail), *step.actions))


def shadow_failed(t: Tick) -> Step:
    """The canary was shown to disagree or fail: rolled back before anyone saw it."""
    result = due_analysis(t)
    t = recorded(t, failed_analyses=t.status.rollout.failed_analyses + 1)
    return roll_back(t, "ShadowFailed", f"at the shadow stage: {result.message}")


def shadow_inconclusive(t: Tick) -> Step:
    """No verdict yet: keep shadowing, until `maxDuration` rolls the canary back."""
    t, _, why = counted_inconclusive(t)
    shadow, stage = t.spec.rollout.shadow, t.status.rollout.shadow
    if shadow is not None and stage is not None and elapsed_s(stage.until, t.now) >= 0:
        detail = (
            f"no verdict within the shadow stage's maxDuration {shadow.max_duration}, never "
            f"passing without evidence: {why}"
        )
        return roll_back(t, "ShadowInconclusive", detail)
    until = stage.until if stage is not None else "maxDuration"
    detail = f"shadowing at weight 0 until {until}: {why}"
    return Step(t.status.model_copy(update=with_rollout(t.status, message=detail)))


def shadow_skipped(t: Tick) -> Step:
    """The promote annotation while shadowing: the stage ends unjudged, the first step begins."""
    step = at_step(t, 0, "PromotedByHand")
    detail = "the promote annotation ended the shadow stage unjudged"
    return Step(step.status, (new_event("Normal", "ShadowSkipped", detail), *step.actions))


def with_shadow_evidence(
    status: InferenceServiceStatus, evidence: ShadowEvidence | None
) -> InferenceServiceStatus:
    """The stage's new evidence and the figures it gives, kept whatever the step does."""
    stage = status.rollout.shadow
    if evidence is None or stage is None or status.current_phase is not P.SHADOWING:
        return status
    return status.model_copy(update=with_rollout(status, shadow=stage.with_evidence(evidence)))


def without_ended_shadow(status: InferenceServiceStatus) -> InferenceServiceStatus:
    """`status.rollout.shadow` is kept only while Shadowing: any move out of it ends the stage."""
    if status.rollout.shadow is None or status.current_phase is P.SHADOWING:
        return status
    return status.model_copy(update=with_rollout(status, shadow=None))
