"""Sequential mode: at every look, the counters' increases fed into anytime-valid tests.

At every look (`rollout.is_watching`), `watch` reads both tracks' cumulative counters
(`read_counts`), feeds the increases since the last look into the tests (`evidence`: the
tests against stable, the absolute bounds' tests, the power gates) and returns the new
`Evidence`, with an `AnalysisResult` when a test rejected (a Failed verdict at once) or the
interval is over. The model's task chooses the tests: errors for both, request latency for
an encoder, time to first token and inter-token latency for a generative model.

At the end of a step's interval the step passes with enough samples, no rejection, its
PromQL checks within bounds, and, when the step is gated (`AnalysisTarget.gated`: its pass
gives the canary more than half of the traffic, or promotes it), every power gate cleared;
until they clear it is `InsufficientEvidence` and the step holds.
"""

from __future__ import annotations

import math

from fleetserve_operator.analysis.evidence import accumulate, sequential_plan
from fleetserve_operator.analysis.prometheus import MetricSource, value_of
from fleetserve_operator.analysis.queries import (
    GAP_CHECKS,
    ITL,
    AnalysisTarget,
    TrackScope,
    buckets_query,
    codes_query,
    generated_query,
    histogram_tests,
)
from fleetserve_operator.analysis.verdict import (
    PlannedCheck,
    inconclusive,
    judge,
    own_checks,
    prometheus_down,
    too_few_samples,
    verdict_of,
)
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.naming import Track
from fleetserve_operator.spec import (
    AnalysisResult,
    AnalysisSpec,
    CheckEvidence,
    CheckOutcome,
    CheckResult,
    Evidence,
    InconclusiveReason,
    TrackCounts,
)

__all__ = ["judged_at_interval_end", "read_counts", "watch", "window_checks"]


def _ordered_buckets(by_le: dict[str, float], bounds: tuple[float, ...]) -> list[float]:
    """Cumulative counts at `bounds`, `+Inf` last; [] unless every bound is there."""
    by_bound: dict[float, float] = {}
    for le, value in by_le.items():
        try:
            by_bound[float(le)] = value
        except ValueError:
            continue
    wanted = [*bounds, math.inf]
    if not all(bound in by_bound for bound in wanted):
        return []
    return [by_bound[bound] for bound in wanted]


def read_counts(
    source: MetricSource, scope: TrackScope, *, generative: bool = False
) -> TrackCounts | None:
    """The track's cumulative counters now (sums over its pods); None without a series.

    Raises:
        MetricsUnavailable: a query failed.
    """
    by_code = source.query_by(codes_query(scope), "code")
    if not by_code:
        return None
    errors = sum(value for code, value in by_code.items() if code.startswith("5"))
    histograms = {
        test.field: _ordered_buckets(source.query_by(buckets_query(scope, test), "le"), test.bounds)
        for test in histogram_tests(generative)
    }
    tokens = (value_of(source, generated_query(scope)) or 0.0) if generative else 0.0
    counts = TrackCounts(requests=sum(by_code.values()), errors=errors, tokens=tokens)
    return counts.model_copy(update=histograms)


def _evidence_checks(evidence: Evidence | None) -> list[CheckResult]:
    """Each sequential test as a check: Rejected, Passed so far, or NoData before samples."""
    results = []
    for check in evidence.checks if evidence is not None else []:
        if check.rejected:
            outcome = CheckOutcome.REJECTED
        else:
            outcome = CheckOutcome.PASSED if check.samples > 0 else CheckOutcome.NO_DATA
        results.append(
            CheckResult(
                name=check.name,
                value=check.e_value,
                max=check.threshold,
                outcome=outcome,
                e_value=check.e_value,
                threshold=check.threshold,
                samples=check.samples,
            )
        )
    return results


def _short_message(spec: AnalysisSpec, short: list[CheckEvidence]) -> str:
    """What each ungated test has seen, and about how much it needs."""
    parts = []
    for check in short:
        unit = ITL.unit if check.name in GAP_CHECKS else "canary requests"
        needed = check.power.samples_needed if check.power is not None else None
        of = "an unknown number" if needed is None else f"about {needed:.0f}"
        parts.append(f"{check.name} has {check.samples:.0f} of {of} {unit}")
    ruled_out = f"to rule out {spec.min_detectable_ratio:g}x stable's odds at power {spec.power:g}"
    return f"{'; '.join(parts)} {ruled_out}"


def window_checks(spec: AnalysisSpec, target: AnalysisTarget) -> list[PlannedCheck]:
    """The checks sequential mode judges by query at a step's end.

    A generative model's preemption and throughput bounds, and the PromQL `checks`; the p99
    bounds are tests on the canary's own counts here, not windows.
    """
    judged = set(sequential_plan(spec, generative=target.generative).guardrails)
    return [check for check in own_checks(spec, target) if check.name not in judged]


def judged_at_interval_end(
    source: MetricSource, spec: AnalysisSpec, target: AnalysisTarget, evidence: Evidence | None
) -> AnalysisResult:
    """The step's verdict once its interval is over.

    It needs enough samples (and tokens), the power gates cleared at a gated step, no
    rejection, and the PromQL checks within bounds. Nothing is queried before the first two.
    """
    samples = evidence.step_samples if evidence is not None else 0.0
    tokens = None
    if target.generative:
        tokens = evidence.step_tokens if evidence is not None else 0.0
    too_few = too_few_samples(spec, target, samples, tokens, "this step")
    if too_few is not None:
        return too_few
    short = evidence.short if evidence is not None else []
    if target.gated and short:
        message = _short_message(spec, short)
        return inconclusive(InconclusiveReason.INSUFFICIENT_EVIDENCE, message, samples, tokens)
    planned = window_checks(spec, target)
    checks = [*_evidence_checks(evidence), *(judge(source, check) for check in planned)]
    return verdict_of(checks, samples, tokens)


def watch(
    source: MetricSource,
    spec: AnalysisSpec,
    target: AnalysisTarget,
    evidence: Evidence | None,
    *,
    due: bool,
) -> tuple[Evidence | None, AnalysisResult | None]:
    """One look of sequential mode: the new evidence, and a result when there is one.

    The result is Failed as soon as a test rejects, whether or not the interval is over;
    at the end of the interval (`due`) it is the step's verdict; else None. A failed read
    leaves the evidence as it was (the next look takes the whole increment).

    The step's verdict rests on this look: when its reads fail, time out, or find no
    series of a track (a Prometheus restarted without its data), it is inconclusive, never
    a pass on the evidence gathered before.
    """
    generative = target.generative
    try:
        canary = read_counts(source, target.canary, generative=generative)
        stable = read_counts(source, target.stable, generative=generative)
    except MetricsUnavailable as exc:
        if not due:
            return evidence, None
        if not source.is_online():
            return evidence, prometheus_down()
        return evidence, inconclusive(InconclusiveReason.QUERY_ERROR, str(exc))
    if canary is not None and stable is not None:
        evidence = accumulate(
            spec,
            evidence,
            canary,
            stable,
            generative=generative,
            canary_alone=target.canary_alone,
            canary_from_now=target.canary_served_copies,
        )
    samples = evidence.step_samples if evidence is not None else None
    if evidence is not None and evidence.rejected:
        tokens = evidence.step_tokens if generative else None
        return evidence, verdict_of(_evidence_checks(evidence), samples or 0.0, tokens)
    if not due:
        return evidence, None
    read = {Track.CANARY: canary, Track.STABLE: stable}
    unseen = [track.value for track, counts in read.items() if counts is None]
    if unseen:
        message = f"no series of the {' and '.join(unseen)} track at the interval's end"
        return evidence, inconclusive(InconclusiveReason.NO_DATA, message, samples)
    return evidence, judged_at_interval_end(source, spec, target, evidence)
