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

__all__ = ["fallback_active", "plan_capacity", "traffic_split"]

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
    if autoscaled or phase is P.PROMOTING:
        return Capacity(stable=None if autoscaled else total, canary=canary)
    gpus, surge = spec.runtime.resources.gpu_count, spec.rollout.max_surge_gpus
    if surge is None or gpus == 0:
        return Capacity(stable=total, canary=canary)
    own = math.ceil((100 - weight) * total / 100)
    return Capacity(stable=max(own, min(total, total + surge // gpus - canary)), canary=canary)
