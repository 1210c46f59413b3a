"""The shadow stage's verdict: does the next version answer like the serving one, and answer?

Before a canary's first step the stable pods copy a sample of live requests to the next
version and compare its answers with theirs (the runtime's `server.shadow`); they count,
labelled with the next version as `shadow_version`, the copies done (`mirrored`), those
the shadow failed (`errors`: 5xx, 4xx, timeout, no connection), the answer units compared
(embedding vectors, greedy generated answers) and those that agreed. `watch` reads the
four sums at every look; `look` (pure) feeds the increases into two pairs of anytime-valid
tests, one pair per rate of a *bad event*:

- **disagreement**: of the compared units, those that did not agree; its bound is
  1 - `min_agreement`;
- **errors**: of the copies, those the shadow failed; its bound is `max_error_rate`,
  judged like a canary's `maxErrorRate`.

Each pair is a rejection test and a gate, both mixtures of Bernoulli likelihood ratios
(`rates.bernoulli_log_ratio`) over the units seen so far:

- the rejection test (`guardrails.BoundTest`: alternative rates whose odds are g times the
  bound's, g in `count_tests.ALTERNATIVES`) bets against "the rate is at most the bound"
  and rejects at 1/(α/2): the verdict is **Failed** at that look. If the shadow is within
  both bounds, the chance that either test ever rejects is at most α, however often it is
  looked at;
- the gate (`BelowTest`: alternative rates whose odds are the bound's divided by g, g in
  `power.ALTERNATIVES`) bets against "the rate is at least the bound" and clears at 1/β,
  β = 1 - `power`, and stays cleared. A shadow whose agreement is at most `min_agreement`
  (or whose error rate is at least `max_error_rate`) clears that gate with probability at
  most β, at any look.

The verdict is **Passed** only when both gates have cleared and at least `min_compared`
units were compared: a gate passes on evidence, never on silence. No series (the stable
pods do not mirror yet), too few units, or gates not yet cleared are **Inconclusive**
(`NoData`, `TooFewRequests`, `InsufficientEvidence`), and so is a look whose queries fail
(`QueryError`, `PrometheusDown`), even after the gates cleared: the verdict rests on the
look. A Failed verdict stays Failed.

A unit is taken as an independent trial. The texts of one request are compared as units
of their own; a shadow that fails a whole kind of request fails many units at once, which
only makes disagreement show sooner. A counter that went back (a stable pod restarted)
gives no increment at that look; the next look counts from the new sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetserve_operator.analysis.count_tests import e_value
from fleetserve_operator.analysis.guardrails import BoundTest
from fleetserve_operator.analysis.power import ALTERNATIVES as GATE_ALTERNATIVES
from fleetserve_operator.analysis.prometheus import MetricSource, value_of
from fleetserve_operator.analysis.queries import TrackScope
from fleetserve_operator.analysis.rates import bernoulli_log_ratio, odds_scaled
from fleetserve_operator.analysis.verdict import inconclusive, prometheus_down
from fleetserve_operator.contract import (
    SHADOW_AGREED_METRIC,
    SHADOW_COMPARED_METRIC,
    SHADOW_ERRORS_METRIC,
    SHADOW_MIRRORED_METRIC,
    SHADOW_VERSION_LABEL,
)
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.spec import (
    AnalysisResult,
    CheckOutcome,
    CheckResult,
    InconclusiveReason,
    RateEvidence,
    ShadowCounts,
    ShadowEvidence,
    ShadowSpec,
    Verdict,
)

__all__ = [
    "AGREEMENT_CHECK",
    "ERRORS_CHECK",
    "BelowTest",
    "RateEvidence",
    "ShadowCounts",
    "ShadowEvidence",
    "ShadowPolicy",
    "look",
    "read_shadow_counts",
    "shadow_queries",
    "watch",
]

AGREEMENT_CHECK = "shadow-agreement"
ERRORS_CHECK = "shadow-error-rate"


@dataclass(frozen=True, slots=True)
class BelowTest:
    """The gate of "the rate of an event is at least `rate`": it clears on evidence below it."""

    rate: float
    beta: float
    """The most probability that a rate at or above `rate` ever clears."""

    @property
    def threshold(self) -> float:
        """The e-value that clears: 1/β."""
        return 1.0 / self.beta

    def start(self) -> tuple[float, ...]:
        """Every component at 0 (e-value 1)."""
        return (0.0,) * len(GATE_ALTERNATIVES)

    def update(self, state: Sequence[float], events: float, trials: float) -> tuple[float, ...]:
        """The state after `events` in `trials`: each component bets on the rate `rate`/g."""
        if trials <= 0:
            return tuple(state)
        steps = [
            bernoulli_log_ratio(events, trials, odds_scaled(self.rate, 1.0 / g), self.rate)
            for g in GATE_ALTERNATIVES
        ]
        return tuple(value + step for value, step in zip(state, steps, strict=True))


@dataclass(frozen=True, slots=True)
class ShadowPolicy:
    """What the shadow stage holds the next version to, and at which levels."""

    min_agreement: float = 0.95
    """Share of compared units that must agree, in (0, 1)."""
    max_error_rate: float = 0.01
    """Most share of copies the shadow may fail, in (0, 1)."""
    alpha: float = 0.01
    """Most probability of a Failed verdict for a shadow within both bounds (half per test)."""
    power: float = 0.9
    """1 - the most probability of a Passed verdict for a shadow at or past either bound."""
    min_compared: int = 100
    """Fewest compared units for a Passed verdict."""

    @classmethod
    def of(cls, spec: ShadowSpec) -> ShadowPolicy:
        """The policy `rollout.shadow` states."""
        return cls(
            min_agreement=spec.min_agreement,
            max_error_rate=spec.max_error_rate,
            alpha=spec.alpha,
            power=spec.power,
            min_compared=spec.min_compared,
        )

    def __post_init__(self) -> None:
        for name in ("min_agreement", "max_error_rate", "alpha", "power"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                msg = f"{name} must lie strictly between 0 and 1, got {value}"
                raise ValueError(msg)

    def rejection(self, bound: float) -> BoundTest:
        """The test that fails the shadow past `bound`, at half of α."""
        return BoundTest(rate=bound, alpha=self.alpha / 2.0)

    def gate(self, bound: float) -> BelowTest:
        """The gate that passes the shadow below `bound`, at β = 1 - power."""
        return BelowTest(rate=bound, beta=1.0 - self.power)


def _advanced(
    evidence: RateEvidence, rejection: BoundTest, gate: BelowTest, events: float, trials: float
) -> RateEvidence:
    before = evidence.rejection or rejection.start()
    gate_before = evidence.gate or gate.start()
    state = gate.update(gate_before, events, trials)
    return RateEvidence(
        trials=evidence.trials + trials,
        events=evidence.events + events,
        rejection=rejection.update(before, events, trials),
        gate=state,
        cleared=evidence.cleared or e_value(state) >= gate.threshold,
    )


def _increment(last: ShadowCounts | None, now: ShadowCounts) -> ShadowCounts | None:
    """What happened since `last` (everything, at the first look); None when a sum went back."""
    before = last or ShadowCounts()
    if any(getattr(now, name) < getattr(before, name) for name in ShadowCounts.model_fields):
        return None
    mirrored = now.mirrored - before.mirrored
    compared = now.compared - before.compared
    return ShadowCounts(
        mirrored=mirrored,
        errors=min(now.errors - before.errors, mirrored),
        compared=compared,
        agreed=min(now.agreed - before.agreed, compared),
    )


def _check(name: str, evidence: RateEvidence, rejection: BoundTest) -> CheckResult:
    e = e_value(evidence.rejection) if evidence.rejection else 1.0
    if e >= rejection.threshold:
        outcome = CheckOutcome.REJECTED
    else:
        outcome = CheckOutcome.PASSED if evidence.trials > 0 else CheckOutcome.NO_DATA
    rate = evidence.events / evidence.trials if evidence.trials > 0 else None
    return CheckResult(
        name=name,
        value=rate,
        max=rejection.rate,
        outcome=outcome,
        e_value=min(e, 1e300),
        threshold=rejection.threshold,
        samples=evidence.trials,
    )


def _state(evidence: RateEvidence, name: str, gate: BelowTest) -> str:
    seen = f"{name} {evidence.events:.0f} of {evidence.trials:.0f}"
    if evidence.cleared:
        return f"{seen} (cleared)"
    e = e_value(evidence.gate) if evidence.gate else 1.0
    return f"{seen} (evidence {e:.3g} of {gate.threshold:.3g} needed)"


def _measured(evidence: ShadowEvidence) -> str:
    """The agreement and the error rate as measured, with their counts."""
    agreed = evidence.disagreement.trials - evidence.disagreement.events
    failed = evidence.errors
    agreement = evidence.disagreement.rate
    shown = "n/a" if agreement is None else f"{1.0 - agreement:.3g}"
    rate = "n/a" if failed.rate is None else f"{failed.rate:.3g}"
    return (
        f"agreement {shown} ({agreed:.0f} of {evidence.disagreement.trials:.0f} answers), "
        f"error rate {rate} ({failed.events:.0f} of {failed.trials:.0f} copies)"
    )


def _verdict(policy: ShadowPolicy, evidence: ShadowEvidence) -> AnalysisResult:
    """The verdict on the evidence as it stands, the look's reads having succeeded."""
    disagreement_bound, error_bound = 1.0 - policy.min_agreement, policy.max_error_rate
    checks = [
        _check(AGREEMENT_CHECK, evidence.disagreement, policy.rejection(disagreement_bound)),
        _check(ERRORS_CHECK, evidence.errors, policy.rejection(error_bound)),
    ]
    compared = evidence.disagreement.trials
    rejected = [check.name for check in checks if check.outcome is CheckOutcome.REJECTED]
    if evidence.failed or rejected:
        message = (
            f"the shadow's disagreement is shown above {disagreement_bound:g} or its error "
            f"rate above {error_bound:g} ({', '.join(rejected) or 'rejected at an earlier look'}): "
            f"{_measured(evidence)}"
        )
        return AnalysisResult(
            verdict=Verdict.FAILED, message=message, requests=compared, checks=checks
        )
    if compared < policy.min_compared:
        message = f"{compared:.0f} of the {policy.min_compared} compared answers needed"
        return inconclusive(InconclusiveReason.TOO_FEW_REQUESTS, message, compared)
    if not (evidence.disagreement.cleared and evidence.errors.cleared):
        parts = [
            _state(evidence.disagreement, "disagreed", policy.gate(disagreement_bound)),
            _state(evidence.errors, "failed", policy.gate(error_bound)),
        ]
        message = (
            f"not yet shown to agree at least {policy.min_agreement:g} and fail at most "
            f"{error_bound:g} at power {policy.power:g}: {'; '.join(parts)}"
        )
        return inconclusive(InconclusiveReason.INSUFFICIENT_EVIDENCE, message, compared)
    shown = f"shown to agree at least {policy.min_agreement:g} and fail at most {error_bound:g}"
    return AnalysisResult(
        verdict=Verdict.PASSED,
        message=shown,
        requests=compared,
        checks=checks,
    )


def look(
    policy: ShadowPolicy, evidence: ShadowEvidence | None, counts: ShadowCounts | None
) -> tuple[ShadowEvidence, AnalysisResult]:
    """One look at the sums read now (None: no series): the new evidence and the verdict."""
    evidence = evidence or ShadowEvidence()
    if counts is None:
        if evidence.failed:
            return evidence, _verdict(policy, evidence)
        message = "no shadow series on the stable pods (not mirroring yet, or no copy done)"
        return evidence, inconclusive(InconclusiveReason.NO_DATA, message)
    step = _increment(evidence.last, counts)
    if step is not None:
        disagreement_bound = 1.0 - policy.min_agreement
        evidence = evidence.model_copy(
            update={
                "disagreement": _advanced(
                    evidence.disagreement,
                    policy.rejection(disagreement_bound),
                    policy.gate(disagreement_bound),
                    step.compared - step.agreed,
                    step.compared,
                ),
                "errors": _advanced(
                    evidence.errors,
                    policy.rejection(policy.max_error_rate),
                    policy.gate(policy.max_error_rate),
                    step.errors,
                    step.mirrored,
                ),
            }
        )
    evidence = evidence.model_copy(update={"last": counts})
    verdict = _verdict(policy, evidence)
    if verdict.verdict is Verdict.FAILED:
        evidence = evidence.model_copy(update={"failed": True})
    return evidence, verdict


def shadow_queries(scope: TrackScope, shadow_version: str) -> dict[str, str]:
    """The PromQL of each sum over the stable pods, in the order they are read.

    Errors before mirrored and agreed before compared: the runtime counts a copy before its
    outcome, so reading in this order never finds more events than trials.
    """
    selector = scope.selector(f'{SHADOW_VERSION_LABEL}="{shadow_version}"')
    metrics = {
        "errors": SHADOW_ERRORS_METRIC,
        "mirrored": SHADOW_MIRRORED_METRIC,
        "agreed": SHADOW_AGREED_METRIC,
        "compared": SHADOW_COMPARED_METRIC,
    }
    return {field: f"sum({metric}{{{selector}}})" for field, metric in metrics.items()}


def read_shadow_counts(
    source: MetricSource, scope: TrackScope, shadow_version: str
) -> ShadowCounts | None:
    """The four sums now; None when the stable pods have no shadow series.

    Raises:
        MetricsUnavailable: a query failed.
    """
    values = {
        field: value_of(source, query)
        for field, query in shadow_queries(scope, shadow_version).items()
    }
    if values["mirrored"] is None:
        return None
    return ShadowCounts(**{field: value or 0.0 for field, value in values.items()})


def watch(
    source: MetricSource,
    policy: ShadowPolicy,
    scope: TrackScope,
    shadow_version: str,
    evidence: ShadowEvidence | None,
) -> tuple[ShadowEvidence | None, AnalysisResult]:
    """One look of the shadow stage: read the stable pods' sums and judge them (`look`).

    `scope` is the stable track's; a failed read leaves the evidence as it was and is
    Inconclusive (`PrometheusDown` or `QueryError`), unless the shadow has already failed.
    """
    try:
        counts = read_shadow_counts(source, scope, shadow_version)
    except MetricsUnavailable as exc:
        if evidence is not None and evidence.failed:
            return evidence, _verdict(policy, evidence)
        if not source.is_online():
            return evidence, prometheus_down()
        return evidence, inconclusive(InconclusiveReason.QUERY_ERROR, str(exc))
    return look(policy, evidence, counts)
