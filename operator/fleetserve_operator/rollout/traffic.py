"""What follows from a status alone: the traffic split and the GPU-aware track sizes.

`render` renders HTTPRoute weights and replica counts from these, and `observe` reports
the canary's effective weight from the split.
"""

from __future__ import annotations

import math

from fleetserve_operator.rollout.data import Capacity, TrafficSplit
from fleetserve_operator.spec import (
    ConditionType,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutPhase,
)

__all__ = [
    "canary_only",
    "fallback_active",
    "plan_capacity",
    "stable_only",
    "standby_replicas",
    "traffic_split",
]

P = RolloutPhase


def fallback_active(status: InferenceServiceStatus) -> bool:
    """True while the `FallbackActive` condition holds."""
    condition = status.condition(ConditionType.FALLBACK_ACTIVE)
    return condition is not None and condition.is_true


def traffic_split(status: InferenceServiceStatus) -> TrafficSplit:
    """The percentages each track should get in `status`."""
    if fallback_active(status):
        return TrafficSplit(stable=0, canary=0, fallback=100)
    phase = status.current_phase
    canary = status.canary_weight if phase.is_rollout_active else 0
    return TrafficSplit(stable=100 - canary, canary=canary, fallback=0)


def plan_capacity(
    spec: InferenceServiceSpec, status: InferenceServiceStatus, *, stable_replicas: int
) -> Capacity:
    """GPU-aware capacity: the canary follows its weight, `maxSurgeGPUs` bounds the extra.

    The canary gets `ceil(weight × stable size)` replicas, at least one. With
    `maxSurgeGPUs`, the stable track shrinks as the canary grows so that the two together
    use at most that many GPUs above the stable size, but never below what its own
    weight needs (so a bound too tight for a 1% canary is exceeded, by one replica). The
    price is a slower rollback: the stable track must grow back after the weight returns.
    Promotion scales the stable back to its full size while the canary still carries all
    traffic (no request dropped), which briefly needs the canary's GPUs on top.
    `stable_replicas` is the observed count, used when an autoscaler (`spec.scaling`, or
    the user's own with `runtime.replicas` min < max) owns it.
    """
    autoscaled = spec.stable_autoscaled
    total = stable_replicas if autoscaled else spec.runtime.replicas.min
    phase = status.current_phase
    if not phase.is_rollout_active:
        return Capacity(stable=None if autoscaled else total, canary=0)
    weight = 100 if phase is P.PROMOTING else status.canary_weight
    canary = max(1, math.ceil(weight * total / 100))
    if phase is P.BAKING:
        return Capacity(stable=None if autoscaled else standby_replicas(spec, total), canary=canary)
    if autoscaled or phase is P.PROMOTING:
        return Capacity(stable=None if autoscaled else total, canary=canary)
    gpus, surge = spec.runtime.resources.gpu_count, spec.rollout.max_surge_gpus
    if surge is None or gpus == 0:
        return Capacity(stable=total, canary=canary)
    own = math.ceil((100 - weight) * total / 100)
    return Capacity(stable=max(own, min(total, total + surge // gpus - canary)), canary=canary)


def standby_replicas(spec: InferenceServiceSpec, total: int) -> int:
    """The stable track's replicas during the bake: `bakeStandbyReplicas`, else its size.

    Its full size by default, so that flipping the traffic back needs no scale-up; with
    `maxSurgeGPUs`, what the bound leaves it next to a full-size canary, but at least one:
    a standby of no pods is no standby.
    """
    chosen = spec.rollout.bake_standby_replicas
    if chosen is not None:
        return chosen
    gpus, surge = spec.runtime.resources.gpu_count, spec.rollout.max_surge_gpus
    if surge is None or gpus == 0:
        return total
    return max(1, min(total, surge // gpus))


def canary_only(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> bool:
    """True while the previous version must get no request at all: the bake's standby.

    From the bake's start until the canary goes (the promotion after it, too: the stable
    track's pods still run the previous version while they roll). With weights alone the
    umbrella Service, which selects every GPU pod, would still reach the standby's.
    """
    phase = status.current_phase
    baked = phase is P.BAKING or (phase is P.PROMOTING and spec.rollout.bake is not None)
    return baked and not fallback_active(status)


def stable_only(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> bool:
    """True while the canary must get no live request at all: before a shadow stage, and in it.

    With `rollout.shadow`, from the canary's start until the stage ends, the canary gets
    only the copies the stable pods send to its own Service. With weights alone the
    umbrella Service, which selects every GPU pod, would reach its ready pods too.
    """
    before = status.current_phase in (P.STARTING, P.SHADOWING)
    return before and spec.rollout.shadow is not None and not fallback_active(status)
