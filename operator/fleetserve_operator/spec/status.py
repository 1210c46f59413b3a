"""What the operator observed: the phase, rollout state, per-track replicas and conditions.

All state lives here, in `.status`, so a restarted operator resumes where it stopped. The
phases are documented once, in `RolloutPhase`; the `Ready` condition's reason is the phase.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from fleetserve_operator.spec.base import Wire
from fleetserve_operator.spec.tracks import GpuTrackSpec

__all__ = [
    "Acknowledgement",
    "AnalysisResult",
    "BakeStatus",
    "RateEvidence",
    "ShadowCounts",
    "ShadowEvidence",
    "ShadowStatus",
    "CheckOutcome",
    "CheckEvidence",
    "CheckResult",
    "PowerEvidence",
    "Condition",
    "ConditionType",
    "Evidence",
    "InconclusiveReason",
    "InferenceServiceStatus",
    "RolloutPhase",
    "RolloutStatus",
    "StepGateStatus",
    "StepWait",
    "TrackCounts",
    "TrackStatus",
    "TracksStatus",
    "Verdict",
    "set_condition",
]

Timestamp = Annotated[str, Field(max_length=64, json_schema_extra={"format": "date-time"})]


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


class Verdict(StrEnum):
    """The outcome of one analysis."""

    PASSED = "Passed"
    """Every check had data and lay within its bounds."""
    FAILED = "Failed"
    """At least one check had data outside its bounds, or a sequential test rejected."""
    INCONCLUSIVE = "Inconclusive"
    """No verdict: too few requests, no data, or Prometheus unreachable. Never a pass."""


class CheckOutcome(StrEnum):
    """The outcome of one check; `NoData` and `QueryError` are not failures."""

    PASSED = "Passed"
    FAILED = "Failed"
    REJECTED = "Rejected"
    """A sequential test's e-value reached its threshold 1/α: conclusive, rolled back at once."""
    NO_DATA = "NoData"
    QUERY_ERROR = "QueryError"


class InconclusiveReason(StrEnum):
    """Why an analysis had no verdict."""

    TOO_FEW_REQUESTS = "TooFewRequests"
    """The canary answered fewer than `minRequests` requests in the window."""
    TOO_FEW_TOKENS = "TooFewTokens"
    """A generative canary generated fewer than `minTokens` tokens in the window."""
    PROMETHEUS_DOWN = "PrometheusDown"
    """Prometheus did not answer its health check."""
    QUERY_ERROR = "QueryError"
    """A query failed."""
    NO_DATA = "NoData"
    """A query returned no series (or NaN)."""
    NOT_RUN = "NotRun"
    """The analysis was due but no result was supplied."""
    INSUFFICIENT_EVIDENCE = "InsufficientEvidence"
    """Sequential mode: the step's interval is over, but the evidence does not yet rule out
    a `minDetectableRatio` regression at `power`; the step holds (not counted as an
    inconclusive analysis), at most `progressDeadline` after its interval."""


class CheckResult(Wire):
    """One check of one analysis: the value, the bounds it was held to, the outcome."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(max_length=64)
    """Built-in check name or `spec.rollout.analysis.checks[].name`."""
    value: float | None = None
    """Measured canary value; unset when there was no data."""
    min: float | None = None
    """Lowest passing value."""
    max: float | None = None
    """Highest passing value (for ratios vs stable: the bound computed from stable's value)."""
    outcome: CheckOutcome
    """Whether the value passed; `NoData`/`QueryError` make the analysis inconclusive."""
    e_value: float | None = Field(None, ge=0)
    """Sequential tests: the evidence against "the canary is no worse than stable"."""
    threshold: float | None = Field(None, gt=0)
    """Sequential tests: the e-value that rejects (1/α of the test)."""
    samples: float | None = Field(None, ge=0)
    """Sequential tests: canary requests (inter-token test: token gaps) the test has seen
    in this rollout."""


class AnalysisResult(Wire):
    """One analysis of the canary: verdict, reason and every check (kept in status)."""

    model_config = ConfigDict(extra="ignore")

    verdict: Verdict
    """Passed, Failed or Inconclusive."""
    reason: InconclusiveReason | None = None
    """Why an inconclusive analysis had no verdict."""
    message: str = Field("", max_length=1024)
    """One line naming the failing or missing checks and their values."""
    requests: float | None = None
    """Canary requests in the window."""
    tokens: float | None = None
    """Generative models: tokens the canary generated in the window."""
    checks: list[CheckResult] = Field(default_factory=list, max_length=32)
    """Per-check values, bounds and outcomes."""
    time: Timestamp | None = None
    """When the rollout recorded it (set by the rollout, not the analysis)."""
    weight: int | None = Field(None, ge=0, le=100)
    """Canary weight while it was measured."""


class TrackCounts(Wire):
    """One track's cumulative counters as last read, from which increments are taken."""

    model_config = ConfigDict(extra="ignore")

    requests: float = Field(0, ge=0)
    """Requests answered (`fleetserve_requests_total`, all codes)."""
    errors: float = Field(0, ge=0)
    """Of those, 5xx answers."""
    latency_buckets: list[Annotated[float, Field(ge=0)]] = Field(
        default_factory=list, max_length=64
    )
    """The request-duration histogram's cumulative bucket counts, in the order of the
    operator's bucket bounds, `+Inf` last; empty before the histogram was read."""
    tokens: float = Field(0, ge=0)
    """Generative models: tokens generated (`fleetserve_generation_tokens_total`)."""
    ttft_buckets: list[Annotated[float, Field(ge=0)]] = Field(default_factory=list, max_length=64)
    """Generative models: the time-to-first-token histogram's cumulative bucket counts,
    like `latencyBuckets`."""
    itl_buckets: list[Annotated[float, Field(ge=0)]] = Field(default_factory=list, max_length=64)
    """Generative models: the inter-token-latency histogram's cumulative bucket counts,
    like `latencyBuckets` (each count is a gap between two tokens)."""


class PowerEvidence(Wire):
    """The running state of a test's power gate (see `fleetserve_operator.analysis.power`)."""

    model_config = ConfigDict(extra="ignore")

    e_value: float = Field(1.0, ge=0)
    """Evidence against "the canary is `minDetectableRatio` times worse"; 1 before any data."""
    threshold: float = Field(gt=0)
    """The e-value that clears the gate: 1/(0.9·(1 - power))."""
    cleared: bool = False
    """The e-value has reached the threshold: a step may advance past half of the traffic."""
    samples_needed: float | None = Field(None, ge=0)
    """About how many canary requests (inter-token test: token gaps) the gate needs in all
    to clear if the canary is like stable, at stable's rate and the traffic split now."""
    baseline_rate: float | None = Field(None, ge=0, le=1)
    """Stable's rate of the gate's event (5xx answers; answers slower than `boundS`)."""
    bound_s: float | None = Field(None, gt=0)
    """Latency tests: the bucket bound a slow answer is slower than (at or above stable's
    p99); unset until stable has answered 100 requests."""
    log_likelihood_ratios: list[float] = Field(default_factory=list, max_length=64)
    """One running sum per component of the gate's mixture."""


class CheckEvidence(Wire):
    """The running state of one sequential test (see `fleetserve_operator.analysis.count_tests`)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(max_length=64)
    """The test: `error-rate-vs-stable`, and `latency-vs-stable` (or, for generative
    models, `ttft-vs-stable` and `itl-vs-stable`); the absolute bounds' tests `error-rate`,
    `p99-latency`, `ttft-p99` and `itl-p99`."""
    e_value: float = Field(1.0, ge=0)
    """Evidence against "the canary is no worse than stable" (an absolute bound's test:
    "the canary's rate is within the bound"); 1 before any data."""
    threshold: float = Field(gt=0)
    """The e-value that rejects: 1/α of this test."""
    samples: float = Field(0, ge=0)
    """Canary requests (inter-token tests: token gaps) the test has seen in this rollout."""
    rejected: bool = False
    """The e-value has reached the threshold: the canary is worse, at level α."""
    log_likelihood_ratios: list[float] = Field(default_factory=list, max_length=512)
    """One running sum per event series and alternative; the e-value is their mixture."""
    power: PowerEvidence | None = None
    """Tests against stable: the evidence that the canary is not `minDetectableRatio` times
    worse, which a step needs before more than half of the traffic or promotion."""


class Evidence(Wire):
    """What the sequential tests have seen of the rollout so far; a restart resumes it."""

    model_config = ConfigDict(extra="ignore")

    canary: TrackCounts | None = None
    """The canary's counters as last taken into the tests."""
    stable: TrackCounts | None = None
    """The stable track's counters as last taken into the tests."""
    step_samples: float = Field(0, ge=0)
    """Canary requests the tests have seen since the current step began."""
    step_tokens: float = Field(0, ge=0)
    """Generative models: tokens the canary generated since the current step began."""
    baseline: TrackCounts | None = None
    """Stable's counters when its traffic ran out (the 100% step): the baseline the canary
    is held to from then on, its counts before the rollout and in the previous steps."""
    checks: list[CheckEvidence] = Field(default_factory=list, max_length=16)
    """One entry per sequential test."""

    @property
    def rejected(self) -> list[CheckEvidence]:
        """The tests that rejected."""
        return [check for check in self.checks if check.rejected]

    @property
    def short(self) -> list[CheckEvidence]:
        """The tests whose power gate has not cleared yet."""
        return [c for c in self.checks if c.power is not None and not c.power.cleared]


class Acknowledgement(Wire):
    """A rollout command annotation the operator has acted on (or ignored, saying why)."""

    model_config = ConfigDict(extra="ignore")

    annotation: str = Field(max_length=253)
    """The annotation key, e.g. `serving.fleetserve.io/promote`."""
    value: str = Field(max_length=256)
    """Its value when acted on; the same value is never acted on twice."""
    time: Timestamp
    """When it was acted on."""
    result: str = Field(max_length=256)
    """What it did, e.g. `promoted to step 3 (50%)` or `ignored in phase Succeeded`."""


class BakeStatus(Wire):
    """The bake after the last step (`rollout.bake`), while the phase is `Baking`."""

    model_config = ConfigDict(extra="ignore")

    since: Timestamp
    """When the canary began to carry all traffic for the bake."""
    until: Timestamp
    """When the bake may end: at the first passing analysis from then on."""
    standby_version: str | None = Field(None, max_length=63)
    """The version the stable track keeps running at weight 0, ready to take traffic back."""
    paused: bool = False
    """Paused by annotation: it goes on baking, and does not end until resumed."""


class ShadowCounts(Wire):
    """The four cumulative sums of the shadow metrics over the stable pods at one look."""

    model_config = ConfigDict(extra="ignore")

    mirrored: float = Field(0, ge=0)
    errors: float = Field(0, ge=0)
    compared: float = Field(0, ge=0)
    agreed: float = Field(0, ge=0)


class RateEvidence(Wire):
    """One bad event's tests: trials and events seen, both states, whether the gate cleared."""

    model_config = ConfigDict(extra="ignore")

    trials: float = 0.0
    events: float = 0.0
    rejection: tuple[float, ...] = Field((), max_length=16)
    gate: tuple[float, ...] = Field((), max_length=16)
    cleared: bool = False

    @property
    def rate(self) -> float | None:
        """Events per trial so far; None before any trial."""
        return self.events / self.trials if self.trials > 0 else None


class ShadowEvidence(Wire):
    """Everything a shadow stage has learnt (`analysis.agreement`); a restart resumes it."""

    model_config = ConfigDict(extra="ignore")

    last: ShadowCounts | None = None
    """The sums at the last look that read them; increments are taken from here."""
    disagreement: RateEvidence = RateEvidence()
    """Compared answers (trials) and those that did not agree (events)."""
    errors: RateEvidence = RateEvidence()
    """Copies done (trials) and those the canary failed (events)."""
    failed: bool = False


class ShadowStatus(Wire):
    """The shadow stage before the first step (`rollout.shadow`), while `Shadowing`."""

    model_config = ConfigDict(extra="ignore")

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


class StepGateStatus(Wire):
    """The hold and gate of the current step, kept while the step has a `stepPolicies` entry.

    Bound to the rollout's spec hash and the step, so neither a re-applied spec nor a
    restarted operator restarts the hold or forgets an approval.
    """

    model_config = ConfigDict(extra="ignore")

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


class RolloutStatus(Wire):
    """The rollout's bookkeeping: what stable runs, what is under rollout, counts, history."""

    model_config = ConfigDict(extra="ignore")

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
    acknowledged: list[Acknowledgement] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["annotation"],
        },
    )
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


class Condition(Wire):
    """A condition in the standard `metav1.Condition` shape."""

    model_config = ConfigDict(extra="ignore")

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


class TrackStatus(Wire):
    """What one track's Deployment runs, and its replica counts."""

    model_config = ConfigDict(extra="ignore")

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
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
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
