"""What the operator observed: the phase, per-track replicas and metav1-shaped conditions.

All state lives here, in `.status`, so a restarted operator resumes where it stopped. The
phases are documented once, in `RolloutPhase`; the `Ready` condition's reason is the phase.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from fleetserve_operator.spec.base import Wire

__all__ = [
    "Condition",
    "ConditionType",
    "InferenceServiceStatus",
    "RolloutPhase",
    "TrackStatus",
    "TracksStatus",
]

Timestamp = Annotated[str, Field(max_length=64, json_schema_extra={"format": "date-time"})]


class RolloutPhase(StrEnum):
    """Where an InferenceService stands (`status.phase`).

    - `Pending`: the stable track has no available replica yet.
    - `Succeeded`: the stable track serves the spec's version and no rollout is running.
    - `Progressing`: a canary takes a growing share of traffic, step by step.
    - `Paused`: a rollout is held (by the pause annotation, or for want of metric data).
    - `Promoting`: the canary passed its last step; the stable track moves to its version.
    - `RollingBack`: the canary failed its analysis; its weight is returning to 0.
    - `RolledBack`: the canary was withdrawn; stable serves the previous version.
    - `Failed`: the spec cannot be deployed; the `Degraded` condition says why.
    """

    PENDING = "Pending"
    SUCCEEDED = "Succeeded"
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    PROMOTING = "Promoting"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"

    @property
    def is_rollout_active(self) -> bool:
        """True while a canary exists and may carry traffic."""
        return self in _ROLLOUT_ACTIVE


_ROLLOUT_ACTIVE = frozenset(
    {
        RolloutPhase.PROGRESSING,
        RolloutPhase.PAUSED,
        RolloutPhase.PROMOTING,
        RolloutPhase.ROLLING_BACK,
    }
)


class ConditionType(StrEnum):
    """The condition types an InferenceService reports."""

    READY = "Ready"
    """The stable track has an available replica; the reason is the phase."""
    PROGRESSING = "Progressing"
    """An owned Deployment (or a rollout) is moving towards the spec."""
    DEGRADED = "Degraded"
    """Something needs a person: an invalid spec, a missing dependency, a memory budget
    too small for the configured batch."""
    FALLBACK_ACTIVE = "FallbackActive"
    """Traffic goes to the CPU fallback track."""


class Condition(Wire):
    """A condition in the standard `metav1.Condition` shape."""

    model_config = ConfigDict(extra="ignore")

    type: str = Field(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        max_length=316,
    )  # noqa: E501  # metav1's own pattern
    """Condition type, e.g. `Ready`."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    observed_generation: int | None = Field(None, ge=0)
    """The `.metadata.generation` the condition was computed for."""
    last_transition_time: Timestamp
    """When `status` last changed (RFC 3339)."""
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    """CamelCase reason for the last transition."""
    message: str = Field("", max_length=32768)
    """Human-readable detail, naming fields and numbers."""

    @property
    def is_true(self) -> bool:
        """True when `status` is `"True"`."""
        return self.status == "True"


class TrackStatus(Wire):
    """Replica counts of one track's Deployment."""

    model_config = ConfigDict(extra="ignore")

    version: str | None = None
    """Model version of the track's pod template."""
    replicas: int = Field(0, ge=0)
    """Desired replicas."""
    ready_replicas: int = Field(0, ge=0)
    """Replicas passing their readiness probe."""
    available_replicas: int = Field(0, ge=0)
    """Replicas ready for at least `minReadySeconds`."""
    updated_replicas: int = Field(0, ge=0)
    """Replicas running the current pod template."""


class TracksStatus(Wire):
    """Per-track replica counts; a track without a Deployment is absent."""

    model_config = ConfigDict(extra="ignore")

    stable: TrackStatus | None = None
    """The GPU track serving the stable version."""
    canary: TrackStatus | None = None
    """The GPU track serving the version under rollout."""
    fallback: TrackStatus | None = None
    """The CPU fallback track."""


class InferenceServiceStatus(Wire):
    """The observed state of an InferenceService (`status`)."""

    model_config = ConfigDict(extra="ignore")

    observed_generation: int | None = Field(None, ge=0)
    """The `.metadata.generation` this status describes."""
    phase: RolloutPhase | None = None
    """Where the service stands; see `RolloutPhase`."""
    stable_version: str | None = None
    """Model version the stable track has fully rolled out."""
    canary_version: str | None = None
    """Model version under rollout, if any."""
    canary_weight: int = Field(0, ge=0, le=100)
    """Percentage of traffic the canary receives."""
    step_index: int | None = Field(None, ge=0)
    """Index into `spec.rollout.steps` of the current step."""
    failed_analyses: int = Field(0, ge=0)
    """Consecutive failed analyses of the current rollout."""
    inconclusive_analyses: int = Field(0, ge=0)
    """Consecutive inconclusive analyses of the current rollout."""
    ready: str | None = Field(None, max_length=32)
    """Ready / desired replicas of the stable track, e.g. `2/2`."""
    tracks: TracksStatus = TracksStatus()
    """Per-track replica counts."""
    last_error: str | None = Field(None, max_length=32768)
    """The last error met while reconciling; cleared by a clean reconcile."""
    last_transition_time: Timestamp | None = None
    """When `phase` last changed."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """`Ready`, `Progressing`, `Degraded`, `FallbackActive`."""

    def condition(self, kind: ConditionType) -> Condition | None:
        """The condition of type `kind`, if reported."""
        return next((c for c in self.conditions if c.type == kind.value), None)
