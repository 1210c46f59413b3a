"""How a track is sized and placed: autoscaling, disruption budget, spreading, precision, backend.

`spec.scaling` / `spec.fallback.scaling` are rendered by `scaling` as a KEDA ScaledObject;
`disruption`, `topologySpread` and `priorityClassName` as a PodDisruptionBudget and pod
template fields. None of them is part of `GpuTrackSpec.digest`: changing them is not a rollout.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from fleetserve_operator.spec.base import AtLeast, Wire, cel, cel_rules, int_or_string

__all__ = [
    "MAX_SCALED_REPLICAS",
    "Backend",
    "DisruptionSpec",
    "MaxUnavailable",
    "Precision",
    "ScalingMetric",
    "ScalingSpec",
    "TopologySpread",
]

MAX_SCALED_REPLICAS = 1000
"""Most replicas an autoscaled track may reach (as `replicas.max`)."""
# The HPA's own bound on a stabilization window.
_MAX_WINDOW_S = 3600

Precision = Literal["fp32", "bf16", "int8"]
"""The runtime's numeric precision (`--precision`): `int8` quantises the encoder's linear
layers dynamically, `bf16` halves weights and activations on hardware that has it."""

Backend = Literal["auto", "torch", "onnxruntime"]
"""What runs the model (`--backend`): `auto` lets the runtime pick (ONNX Runtime for
`builtin://minilm-l6` on the CPU in fp32, torch otherwise); ONNX Runtime runs on the CPU
only and serves fp32 or int8."""


class ScalingMetric(StrEnum):
    """The inference signal a track is scaled on (the runtime's own metrics)."""

    INFLIGHT_REQUESTS = "inflightRequests"
    """Requests accepted and not yet answered, per replica."""
    QUEUE_WAIT_P90 = "queueWaitP90"
    """The track's 90th-percentile queue wait, in seconds."""
    KV_CACHE_USAGE = "kvCacheUsage"
    """Share (0-1) of the KV cache held by sequences, per replica; generative models only."""


_REPLICAS = AtLeast("scaling", "maxReplicas", "minReplicas")


class ScalingSpec(Wire):
    """Autoscaling of one track on an inference signal, rendered as a KEDA ScaledObject.

    KEDA creates and drives a HorizontalPodAutoscaler that owns the Deployment's replica
    count; the operator then leaves `spec.replicas` to it (and ignores the track's
    `replicas`). Reads the Prometheus the operator uses for analysis.
    """

    model_config = cel_rules(
        _REPLICAS.cel(),
        cel(
            "self.metric != 'kvCacheUsage' || self.target <= 1.0",
            "scaling.target is a fraction of the KV cache (0-1] for metric kvCacheUsage",
            ".target",
        ),
    )

    min_replicas: int = Field(1, ge=1, le=MAX_SCALED_REPLICAS)
    """Fewest replicas; the scaler never goes below (KEDA's `minReplicaCount`)."""
    max_replicas: int = Field(ge=1, le=MAX_SCALED_REPLICAS)
    """Most replicas the scaler may run (KEDA's `maxReplicaCount`)."""
    metric: ScalingMetric = ScalingMetric.INFLIGHT_REQUESTS
    """What to scale on: `inflightRequests` (per replica), `queueWaitP90` (seconds, for the
    whole track) or `kvCacheUsage` (fraction per replica, generative models only)."""
    target: float = Field(gt=0, le=1_000_000)
    """The value of `metric` to hold: per replica for `inflightRequests` and `kvCacheUsage`
    (replicas = total / target), for the track for `queueWaitP90` (replicas grow in
    proportion to p90 / target)."""
    scale_up_window_seconds: int = Field(0, ge=0, le=_MAX_WINDOW_S)
    """How long a higher replica count must be wanted before scaling up (HPA stabilization
    window); 0 reacts at the next poll."""
    scale_down_window_seconds: int = Field(300, ge=0, le=_MAX_WINDOW_S)
    """How long a lower replica count must be wanted before scaling down; a short window
    sheds replicas a bursty load will need again."""
    polling_interval_seconds: int = Field(15, ge=1, le=_MAX_WINDOW_S)
    """How often KEDA queries Prometheus."""

    @model_validator(mode="after")
    def _check(self) -> ScalingSpec:
        _REPLICAS.check(self)
        if self.metric is ScalingMetric.KV_CACHE_USAGE and self.target > 1:
            msg = (
                f"scaling.target ({self.target}) is a fraction of the KV cache (0-1] for "
                "metric kvCacheUsage"
            )
            raise ValueError(msg)
        return self


_PERCENT_RE = r"^(100|[1-9][0-9]?)%$"


def _valid_max_unavailable(value: int | str) -> int | str:
    if isinstance(value, int) and 1 <= value <= MAX_SCALED_REPLICAS:
        return value
    if isinstance(value, str) and re.fullmatch(_PERCENT_RE, value):
        return value
    msg = (
        f"maxUnavailable must be a count 1..{MAX_SCALED_REPLICAS} or a percentage "
        f"1%..100%, got {value!r}: 0 would block every node drain"
    )
    raise ValueError(msg)


MaxUnavailable = Annotated[
    int | str,
    AfterValidator(_valid_max_unavailable),
    int_or_string(
        pattern=_PERCENT_RE, maxLength=len("100%"), minimum=1, maximum=MAX_SCALED_REPLICAS
    ),
]
"""A replica count (1 or more) or a percentage (`1%`-`100%`) of the track's replicas."""


class DisruptionSpec(Wire):
    """The track's PodDisruptionBudget: how many pods a node drain may take at once."""

    max_unavailable: MaxUnavailable = 1
    """Pods of the track voluntary disruptions (drains, upgrades) may take down together.
    Rendered only while the track runs 2 or more replicas or is autoscaled: with one replica
    a budget either lets its only pod go or blocks every node drain."""


class TopologySpread(StrEnum):
    """How a track's pods spread across nodes and zones."""

    SCHEDULE_ANYWAY = "ScheduleAnyway"
    """Prefer distinct nodes, then zones; never blocks scheduling."""
    DO_NOT_SCHEDULE = "DoNotSchedule"
    """At most one pod more on a node than on any other; a pod that cannot keep it waits.
    Zones stay a preference (a cluster without zone labels would schedule nothing)."""
    OFF = "Off"
    """No spreading constraints."""
