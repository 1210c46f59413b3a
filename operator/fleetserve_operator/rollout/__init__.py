"""Pure rollout state machine: spec, status, observed facts and clock → transition.

`sync` calls `next_step` on every reconcile of an InferenceService (spec change, child event,
the resync timer). When `is_analysis_due` says so, it first runs `analysis.evaluate` and puts
the result in `Facts`. `next_step` returns the new status, from which `render` renders the
children (canary, stable spec, weights, replicas), and the side effects to apply (`Action`:
Events, counters, clearing a command annotation). It does no I/O, so a restarted operator
that feeds in the same status gets the same step back and never restarts or double-promotes
a rollout.

- `data`: what goes in (`Facts`) and out (`Transition`, the `Action` kinds), and `Trigger`.
- `traffic`: the traffic split and GPU-aware track sizes that follow from a status.
- `moves`: one handler per row of the table.
- `gates`: the rows of steps with a hold or a manual gate, and their bookkeeping; the
  `confirm` webhooks' veto.
- `shadow`: the rows of the shadow stage before the first step (`Shadowing`).
- `notify`: the `notify` webhooks' actions that follow from a transition's Events.
- `machine`: `TRANSITIONS`, the only table, and `next_step`.

The phases are documented once, in `spec.RolloutPhase`. One trigger is acted on per call:
the first in `Trigger`'s order that holds and has a row for the phase (a command annotation
without a row is acknowledged as ignored). CPU fallback failover is orthogonal to the phase:
it is decided first, and while it is active no analysis is due and no step advances.
"""

from __future__ import annotations

from fleetserve_operator.rollout.data import (
    Action,
    Capacity,
    ClearAnnotation,
    Confirmation,
    Facts,
    IncrementCounter,
    Notify,
    OperatorCounter,
    TrackFacts,
    TrafficSplit,
    Transition,
    Trigger,
)
from fleetserve_operator.rollout.gates import asks_confirmation
from fleetserve_operator.rollout.machine import TRANSITIONS, next_step
from fleetserve_operator.rollout.moves import is_analysis_due, is_shadow_due, is_watching
from fleetserve_operator.rollout.traffic import (
    canary_only,
    fallback_active,
    plan_capacity,
    stable_only,
    traffic_split,
)

__all__ = [
    "TRANSITIONS",
    "Action",
    "Capacity",
    "ClearAnnotation",
    "Confirmation",
    "Facts",
    "IncrementCounter",
    "Notify",
    "OperatorCounter",
    "TrackFacts",
    "TrafficSplit",
    "Transition",
    "Trigger",
    "asks_confirmation",
    "canary_only",
    "fallback_active",
    "is_analysis_due",
    "is_shadow_due",
    "is_watching",
    "next_step",
    "plan_capacity",
    "stable_only",
    "traffic_split",
]
