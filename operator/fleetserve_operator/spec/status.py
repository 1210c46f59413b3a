"""What the operator observed: the phase, rollout state, per-track replicas and conditions.

All state lives here, in `.status`, so a restarted operator resumes where it stopped. The
phases are documented once, in `RolloutPhase`; the `Ready` condition's reason is the phase.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from fleetserve_operator.spec.base import StatusWire, Timestamp, keyed_list
from fleetserve_operator.spec.evidence import (
    AnalysisResult,
    Evidence,
    ShadowEvidence,
)
from fleetserve_operator.spec.tracks import GpuTrackSpec

__all__ = [
    "Acknowledgement",
    "BakeStatus",
    "ShadowStatus",
    "Condition",
    "ConditionType",
    "InferenceServiceStatus",
    "RolloutPhase",
    "RolloutStatus",
    "StepGateStatus",
    "StepWait",
    "TrackStatus",
    "TracksStatus",
    "set_condition",
]


class RolloutPhase(StrEnum):
    """Where an InferenceService stands (`status.phase`); `rollout.next_step` moves it.

    - `Pending`: no rollout; the stable track has no available replica yet.
    - `Succeeded`: no rollout; the stable track serves the spec.
    - `Starting`: a canary runs the new spec at weight 0 until it is Ready (or the
      `progressDeadline` passes).
    - `Shadowing`: the canary is Ready and `rollout.shadow` is set: at weight 0 it gets a
      copy of a sample of the stable pods' live requests, its answers compared with theirs
      and never returned; shown to agree, it takes the first step (`Progressing`); shown to
      disagree or fail, or without a verdict within `maxDuration`, it is rolled back.
    - `Progressing`: the canary holds a step's weight; at the end of each interval the
      analysis decides: advance, count a failure, or count an inconclusive result (in
      sequential mode a rejecting test rolls the canary back at once, at any look).
    - `Paused`: a person paused the rollout; the weight stays, but analysis still runs and
      a failing canary is still rolled back.
    - `Holding`: `inconclusiveThreshold` analyses in a row had no verdict (too little
      traffic, Prometheus down), or a step before more than half of the traffic waits for
      the evidence of sequential mode's power gates; the weight stays until a verdict,
      never promoting on missing data (a wait for evidence ends at `progressDeadline`).
    - `Baking`: the last step passed and `rollout.bake` is set: the canary carries all
      traffic for the bake, judged against stable's baseline, while the stable track keeps
      the previous version running at weight 0 (the hot standby); a failure flips the
      weights back to it (`RolledBack`), the bake's end promotes (`Promoting`). A pause
      keeps it baking past its end.
    - `Promoting`: the last step (or the bake) passed; the stable track rolls to the new
      spec while the canary carries all traffic, then the canary goes.
    - `RolledBack`: the canary was withdrawn (failed analyses, OOM kill or restart, abort);
      stable serves the previous spec until the spec changes or `retry` is annotated.
    - `Failed`: the spec cannot be deployed: it is invalid, or its canary never became Ready.
    """

    PENDING = "Pending"
    SUCCEEDED = "Succeeded"
    STARTING = "Starting"
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    HOLDING = "Holding"
    PROMOTING = "Promoting"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    BAKING = "Baking"
    SHADOWING = "Shadowing"

    @property
    def is_rollout_active(self) -> bool:
        """True while a canary exists and may carry traffic."""
        return self in _ROLLOUT_ACTIVE

    @property
    def is_analysing(self) -> bool:
        """True while the canary holds a step's weight and is judged every interval."""
        return self in _ANALYSING


_ANALYSING = frozenset(
    {RolloutPhase.PROGRESSING, RolloutPhase.PAUSED, RolloutPhase.HOLDING, RolloutPhase.BAKING}
)
_ROLLOUT_ACTIVE = _ANALYSING | {
    RolloutPhase.STARTING,
    RolloutPhase.SHADOWING,
    RolloutPhase.PROMOTING,
}


class Acknowledgement(StatusWire):
    """A rollout command annotation the operator has acted on (or ignored, saying why)."""

    annotation: str = Field(max_length=253)
    """The annotation key, e.g. `serving.fleetserve.io/promote`."""
    value: str = Field(max_length=256)
    """Its value when acted on; the same value is never acted on twice."""
    time: Timestamp
    """When it was acted on."""
    result: str = Field(max_length=256)
    """What it did, e.g. `promoted to step 3 (50%)` or `ignored in phase Succeeded`."""


class BakeStatus(StatusWire):
    """The bake after the last step (`rollout.bake`), while the phase is `Baking`."""

    since: Timestamp
    """When the canary began to carry all traffic for the bake."""
    until: Timestamp
    """When the bake may end: at the first passing analysis from then on."""
    standby_version: str | None = Field(None, max_length=63)
    """The version the stable track keeps running at weight 0, ready to take traffic back."""
    paused: bool = False
    """Paused by annotation: it goes on baking, and does not end until resumed."""


class ShadowStatus(StatusWire):
    """The shadow stage before the first step (`rollout.shadow`), while `Shadowing`."""

    since: Timestamp
    """When the stable pods were told to copy to the canary."""
    until: Timestamp
    """When the stage ends without a verdict (`maxDuration`): the canary is rolled back."""
    compared: float = Field(0, ge=0)
    """Answers compared so far."""
    agreement: float | None = Field(None, ge=0, le=1)
    """Share of them that agreed; unset before the first."""
    mirrored: float = Field(0, ge=0)
    """Copies the canary answered or failed so far."""
    error_rate: float | None = Field(None, ge=0, le=1)
    """Share of them it failed; unset before the first."""
    evidence: ShadowEvidence = ShadowEvidence()
    """The sequential tests' state (`analysis.agreement`)."""

    def with_evidence(self, evidence: ShadowEvidence) -> ShadowStatus:
        """This stage with `evidence` and the figures it gives."""
        disagreement = evidence.disagreement.rate
        return self.model_copy(
            update={
                "evidence": evidence,
                "compared": evidence.disagreement.trials,
                "agreement": None if disagreement is None else 1.0 - disagreement,
                "mirrored": evidence.errors.trials,
                "error_rate": evidence.errors.rate,
            }
        )


class StepWait(StrEnum):
    """What a step whose analysis passed is waiting for (`status.rollout.stepGate.waiting`)."""

    HOLD = "Hold"
    """Its `hold` has not elapsed (`holdUntil`)."""
    AWAITING_APPROVAL = "AwaitingApproval"
    """Its manual gate: the `approve` annotation naming its weight."""


class StepGateStatus(StatusWire):
    """The hold and gate of the current step, kept while the step has a `stepPolicies` entry.

    Bound to the rollout's spec hash and the step, so neither a re-applied spec nor a
    restarted operator restarts the hold or forgets an approval.
    """

    spec_hash: str | None = Field(None, max_length=64)
    """The spec under rollout when the step began."""
    step: int = Field(ge=0)
    """Index into `spec.rollout.steps`."""
    weight: int = Field(ge=0, le=100)
    """The step's weight."""
    started_at: Timestamp
    """When the canary got this step's weight; the hold counts from here."""
    hold_until: Timestamp | None = None
    """When the step's `hold` ends; unset without a hold."""
    waiting: StepWait | None = None
    """What the step waits for since its analysis passed; unset while it is analysed, and
    once it is approved."""
    waiting_since: Timestamp | None = None
    """When it began waiting for that."""
    approved_at: Timestamp | None = None
    """When the `approve` annotation opened its manual gate."""


class RolloutStatus(StatusWire):
    """The rollout's bookkeeping: what stable runs, what is under rollout, counts, history."""

    stable_hash: str | None = Field(None, max_length=64)
    """Hash of the GPU-track spec the stable track runs (`GpuTrackSpec.digest`)."""
    stable_spec: GpuTrackSpec | None = None
    """The GPU-track spec the stable track runs; the spec itself is never rewritten."""
    spec_hash: str | None = Field(None, max_length=64)
    """Hash under rollout; after a rollback, the failed one (so it is not retried by itself)."""
    step_index: int | None = Field(None, ge=0)
    """Index into `spec.rollout.steps` of the current step; unset before the first."""
    canary_started_at: Timestamp | None = None
    """When the canary was (re)created; `progressDeadline` counts from here."""
    interval_started_at: Timestamp | None = None
    """When the current analysis interval began; the next analysis is due one
    `interval` later."""
    failed_analyses: int = Field(0, ge=0)
    """Consecutive failed analyses (an inconclusive one neither counts nor resets)."""
    inconclusive_analyses: int = Field(0, ge=0)
    """Consecutive inconclusive analyses."""
    analyses: list[AnalysisResult] = Field(default_factory=list, max_length=100)
    """The last `analysis.historyLimit` analyses, newest last."""
    evidence: Evidence | None = None
    """Sequential mode: the tests' running evidence, updated at every look."""
    acknowledged: list[Acknowledgement] = keyed_list("annotation", max_length=8)
    """Command annotations acted on, while they are still present."""
    message: str = Field("", max_length=4096)
    """Why the rollout is where it is (hold reason, failing values)."""
    bake: BakeStatus | None = None
    """The bake, while the phase is `Baking`."""
    shadow: ShadowStatus | None = None
    """The shadow stage, while the phase is `Shadowing`."""
    step_gate: StepGateStatus | None = None
    """The current step's hold and manual gate (`rollout.stepPolicies`), if it has them."""


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
    PROMOTED = "Promoted"
    """The stable track serves the spec; False during and after a rollout. The reason is
    the phase and the message says why (failing values, hold reason)."""
    MODEL_FETCHED = "ModelFetched"
    """Fetched models only (s3, oci, https, hf): True once every current pod's init
    container has installed the model; False while one fetches (`Fetching`), when one
    failed (the fetch's reason) or when pods fetched different bytes (`DigestsDiffer`).
    The message gives each track's fetched/current pods and the digests they serve."""


class Condition(StatusWire):
    """A condition in the standard `metav1.Condition` shape."""

    type: str = Field(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        max_length=316,
    )  # metav1's own pattern
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


class TrackStatus(StatusWire):
    """What one track's Deployment runs, and its replica counts."""

    version: str | None = Field(None, max_length=63)
    """Model version of the track's pod template."""
    image: str | None = Field(None, max_length=512)
    """Runtime image of the track's pod template: the spec's, else the operator's default."""
    model_digest: str | None = Field(None, max_length=80)
    """Fetched models: the digest of the bytes the track's pods installed, as their fetch
    reported it (the manifest, file or file-listing digest); unset until one completed,
    or while pods disagree."""
    replicas: int = Field(0, ge=0)
    """Desired replicas."""
    ready_replicas: int = Field(0, ge=0)
    """Replicas passing their readiness probe."""
    available_replicas: int = Field(0, ge=0)
    """Replicas ready for at least `minReadySeconds`."""
    updated_replicas: int = Field(0, ge=0)
    """Replicas running the current pod template."""


class TracksStatus(StatusWire):
    """Per-track replica counts; a track without a Deployment is absent."""

    stable: TrackStatus | None = None
    """The GPU track serving the stable version."""
    canary: TrackStatus | None = None
    """The GPU track serving the version under rollout."""
    fallback: TrackStatus | None = None
    """The CPU fallback track."""


class InferenceServiceStatus(StatusWire):
    """The observed state of an InferenceService (`status`)."""

    observed_generation: int | None = Field(None, ge=0)
    """The `.metadata.generation` this status describes."""
    phase: RolloutPhase | None = None
    """Where the service stands; see `RolloutPhase`."""
    stable_version: str | None = Field(None, max_length=63)
    """Model version the stable track has fully rolled out."""
    canary_version: str | None = Field(None, max_length=63)
    """Model version under rollout, if any."""
    canary_weight: int = Field(0, ge=0, le=100)
    """Percentage of traffic the rollout's current step gives the canary."""
    effective_canary_weight: int = Field(0, ge=0, le=100)
    """Percentage the canary really receives: `canaryWeight` with an HTTPRoute; its share
    of ready replicas with `traffic.provider: replicas`, which can be far more."""
    rollout: RolloutStatus = RolloutStatus()
    """The rollout's state; a restarted operator resumes from it."""
    ready: str | None = Field(None, max_length=32)
    """Ready / desired replicas of the stable track, e.g. `2/2`."""
    tracks: TracksStatus = TracksStatus()
    """Per-track replica counts."""
    last_error: str | None = Field(None, max_length=32768)
    """The last error met while reconciling; cleared by a clean reconcile."""
    last_transition_time: Timestamp | None = None
    """When `phase` last changed."""
    conditions: list[Condition] = keyed_list("type", max_length=16)
    """`Ready`, `Progressing`, `Degraded`, `FallbackActive`, `Promoted`, and for fetched
    models `ModelFetched`."""

    @property
    def current_phase(self) -> RolloutPhase:
        """`phase`, where a fresh object (no phase reported yet) counts as Pending."""
        return self.phase or RolloutPhase.PENDING

    def condition(self, kind: ConditionType) -> Condition | None:
        """The condition of type `kind`, if reported."""
        return next((c for c in self.conditions if c.type == kind.value), None)


def set_condition(conditions: list[Condition], new: Condition, *, now: str) -> list[Condition]:
    """`conditions` with `new` in place of its type; keeps the transition time if unchanged."""
    old = next((c for c in conditions if c.type == new.type), None)
    stamp = old.last_transition_time if old and old.status == new.status else now
    updated = new.model_copy(update={"last_transition_time": stamp})
    if old is None:
        return [*conditions, updated]
    return [updated if c.type == new.type else c for c in conditions]
