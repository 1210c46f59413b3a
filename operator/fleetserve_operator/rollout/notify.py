"""What the `notify` webhooks are told: the rollout events of a transition, as actions.

The events are the transition's own Events (their reasons are `RolloutEvent`s) and the
phase changes into and out of Paused, which the pause and resume commands make without an
Event of their own. One `Notify` per webhook that lists the event, applied after the status
write like every other action.
"""

from __future__ import annotations

from fleetserve_operator.records import EventNote
from fleetserve_operator.rollout.data import Action, Notify
from fleetserve_operator.spec import (
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutEvent,
    RolloutPhase,
    WebhookType,
)

__all__ = ["notifications"]

_BY_REASON = {event.value: event for event in RolloutEvent} | {
    "RolloutRestarted": RolloutEvent.ROLLOUT_STARTED,
    "CanaryReady": RolloutEvent.STEP_ADVANCED,
    "PromotedByHand": RolloutEvent.STEP_ADVANCED,
}
"""Event reason → rollout event (most are the same word)."""


def _events(
    before: InferenceServiceStatus, after: InferenceServiceStatus, actions: tuple[Action, ...]
) -> list[tuple[RolloutEvent, str]]:
    found = [
        (_BY_REASON[a.reason], a.message)
        for a in actions
        if isinstance(a, EventNote) and a.reason in _BY_REASON
    ]
    was, now = before.current_phase, after.current_phase
    weight = f"at {after.canary_weight}%"
    if now is RolloutPhase.PAUSED and was is not RolloutPhase.PAUSED:
        found.append((RolloutEvent.PAUSED, f"paused {weight}"))
    elif was is RolloutPhase.PAUSED and now.is_analysing and now is not RolloutPhase.PAUSED:
        found.append((RolloutEvent.RESUMED, f"resumed {weight}"))
    return found


def notifications(
    spec: InferenceServiceSpec | None,
    before: InferenceServiceStatus,
    after: InferenceServiceStatus,
    actions: tuple[Action, ...],
) -> tuple[Notify, ...]:
    """A `Notify` for each event of the transition and each webhook that lists it."""
    hooks = spec.rollout.webhooks_of(WebhookType.NOTIFY) if spec is not None else []
    if not hooks:
        return ()
    return tuple(
        Notify(webhook=hook, event=event, message=message, status=after)
        for event, message in _events(before, after, actions)
        for hook in hooks
        if event in hook.events
    )
