"""What one look at the metrics found: verdicts, check results and the evidence they carry.

`status.rollout.analyses` holds these records for canary steps, `status.rollout.evidence`
the sequential tests' running state, and the shadow stage's `ShadowEvidence` the same for its
two rates; each survives an operator restart because it lives in status.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from fleetserve_operator.spec.base import StatusWire, Timestamp

__all__ = [
    "AnalysisResult",
    "CheckEvidence",
    "CheckOutcome",
    "CheckResult",
    "Evidence",
    "InconclusiveReason",
    "PowerEvidence",
    "RateEvidence",
    "ShadowCounts",
    "ShadowEvidence",
    "TrackCounts",
    "Verdict",
]


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


class CheckResult(StatusWire):
    """One check of one analysis: the value, the bounds it was held to, the outcome."""

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


class AnalysisResult(StatusWire):
    """One analysis of the canary: verdict, reason and every check (kept in status)."""

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


class TrackCounts(StatusWire):
    """One track's cumulative counters as last read, from which increments are taken."""

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


class PowerEvidence(StatusWire):
    """The running state of a test's power gate (see `fleetserve_operator.analysis.power`)."""

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


class CheckEvidence(StatusWire):
    """The running state of one sequential test (see `fleetserve_operator.analysis.count_tests`)."""

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


class Evidence(StatusWire):
    """What the sequential tests have seen of the rollout so far; a restart resumes it."""

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


class ShadowCounts(StatusWire):
    """The four cumulative sums of the shadow metrics over the stable pods at one look."""

    mirrored: float = Field(0, ge=0)
    errors: float = Field(0, ge=0)
    compared: float = Field(0, ge=0)
    agreed: float = Field(0, ge=0)


class RateEvidence(StatusWire):
    """One bad event's tests: trials and events seen, both states, whether the gate cleared."""

    trials: float = 0.0
    events: float = 0.0
    rejection: tuple[float, ...] = Field((), max_length=16)
    gate: tuple[float, ...] = Field((), max_length=16)
    cleared: bool = False

    @property
    def rate(self) -> float | None:
        """Events per trial so far; None before any trial."""
        return self.events / self.trials if self.trials > 0 else None


class ShadowEvidence(StatusWire):
    """Everything a shadow stage has learnt (`analysis.agreement`); a restart resumes it."""

    last: ShadowCounts | None = None
    """The sums at the last look that read them; increments are taken from here."""
    disagreement: RateEvidence = RateEvidence()
    """Compared answers (trials) and those that did not agree (events)."""
    errors: RateEvidence = RateEvidence()
    """Copies done (trials) and those the canary failed (events)."""
    failed: bool = False
