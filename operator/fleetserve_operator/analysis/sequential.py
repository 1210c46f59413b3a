"""Sequential mode: at every look, the counters' increases fed into anytime-valid tests.

At every look (`rollout.is_watching`), `watch` reads both tracks' cumulative counters
(`read_counts`), feeds the increases since the last look into the tests of `count_tests`
(`accumulate`, pure) and returns the new `Evidence`, with an `AnalysisResult` when a test
rejected (a Failed verdict at once) or the interval is over. The model's task chooses the
tests (`sequential_tests`): errors for both, request latency for an encoder, time to first
token and inter-token latency for a generative model.
"""

from __future__ import annotations

import math

from fleetserve_operator.analysis.count_tests import CountTest, Increment, exceedances
from fleetserve_operator.analysis.prometheus import MetricSource, value_of
from fleetserve_operator.analysis.queries import (
    ERROR_TEST,
    ITL,
    LATENCY,
    TTFT,
    AnalysisTarget,
    HistogramTest,
    TrackScope,
    buckets_query,
    codes_query,
    generated_query,
    histogram_tests,
)
from fleetserve_operator.analysis.verdict import (
    gated_verdict,
    inconclusive,
    own_checks,
    prometheus_down,
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

__all__ = ["accumulate", "read_counts", "sequential_tests", "watch"]


def sequential_tests(spec: AnalysisSpec, *, generative: bool = False) -> dict[str, CountTest]:
    """The built-in anytime-valid tests, each at level α / (number of tests).

    Errors: 5xx answers (generation requests, streams that failed midway included), one
    event series. Each latency histogram: answers (or token gaps) slower than each of its
    bucket bounds, one series per bound.
    """
    latency = histogram_tests(generative)
    alpha = spec.alpha / (1 + len(latency))
    tests = {ERROR_TEST: CountTest(spec.error_tolerance, alpha)}
    for test in latency:
        tests[test.name] = CountTest(spec.latency_tolerance, alpha, series=len(test.bounds))
    return tests


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


def _buckets(counts: TrackCounts, test: HistogramTest) -> list[float]:
    buckets: list[float] = getattr(counts, test.field)
    return buckets


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


def _went_back(before: TrackCounts, now: TrackCounts) -> bool:
    """A counter sum decreased: a pod restarted or left, so this increment is unknown."""
    pairs = [(before.requests, now.requests), (before.errors, now.errors)]
    pairs.append((before.tokens, now.tokens))
    for test in (LATENCY, TTFT, ITL):
        earlier, later = _buckets(before, test), _buckets(now, test)
        if len(earlier) == len(later):
            pairs += list(zip(earlier, later, strict=True))
    return any(after < prior for prior, after in pairs)


def _latency_increment(
    test: HistogramTest,
    canary: tuple[TrackCounts, TrackCounts],
    stable: tuple[TrackCounts, TrackCounts],
    requests: float,
) -> Increment | None:
    """Counts per track and counts slower than each bound, between two reads.

    `requests`: both tracks' requests in the increment, by which a `per_request` test's
    events are weighed.
    """
    deltas: list[list[float]] = []
    for before, now in (canary, stable):
        earlier, later = _buckets(before, test), _buckets(now, test)
        if not earlier or len(earlier) != len(later):
            return None
        deltas.append([b - a for a, b in zip(earlier, later, strict=True)])
    canary_delta, stable_delta = deltas
    counted = canary_delta[-1] + stable_delta[-1]
    weight = min(1.0, requests / counted) if test.per_request and counted > 0 else 1.0
    return Increment(
        canary_requests=canary_delta[-1],
        stable_requests=stable_delta[-1],
        canary_events=tuple(weight * k for k in exceedances(canary_delta)),
        stable_events=tuple(weight * m for m in exceedances(stable_delta)),
    )


def _start(
    spec: AnalysisSpec, canary: TrackCounts, stable: TrackCounts, *, generative: bool
) -> Evidence:
    """Evidence before any increment: stable's counters from now, the canary's from 0.

    The canary's series exist at 0 from the moment its version loaded, so everything it
    answered counts; stable's history before the rollout is not comparable.
    """
    zero = TrackCounts().model_copy(
        update={
            test.field: [0.0] * len(_buckets(canary, test)) for test in histogram_tests(generative)
        }
    )
    checks = [
        CheckEvidence(
            name=name,
            threshold=test.threshold,
            log_likelihood_ratios=list(test.start()),
        )
        for name, test in sequential_tests(spec, generative=generative).items()
    ]
    return Evidence(canary=zero, stable=stable, checks=checks)


def _advanced(check: CheckEvidence, test: CountTest, increment: Increment | None) -> CheckEvidence:
    state = tuple(check.log_likelihood_ratios) or test.start()
    if increment is not None:
        state = test.update(state, increment)
    kept = [round(value, 6) for value in state]
    e_value = float(f"{test.e_value(kept):.6g}")
    samples = check.samples + (increment.canary_requests if increment is not None else 0.0)
    return check.model_copy(
        update={
            "log_likelihood_ratios": kept,
            "e_value": e_value,
            "samples": samples,
            "rejected": check.rejected or e_value >= test.threshold,
        }
    )


def _increments(
    canary: tuple[TrackCounts, TrackCounts],
    stable: tuple[TrackCounts, TrackCounts],
    *,
    generative: bool,
) -> dict[str, Increment | None]:
    """Each test's increment between two reads (before, now) of both tracks.

    Only called when both tracks answered requests in between.
    """
    (before_canary, now_canary), (before_stable, now_stable) = canary, stable
    served = now_canary.requests - before_canary.requests
    compared = now_stable.requests - before_stable.requests
    increments: dict[str, Increment | None] = {
        ERROR_TEST: Increment(
            canary_requests=served,
            stable_requests=compared,
            canary_events=(now_canary.errors - before_canary.errors,),
            stable_events=(now_stable.errors - before_stable.errors,),
        )
    }
    for test in histogram_tests(generative):
        increments[test.name] = _latency_increment(test, canary, stable, served + compared)
    return increments


def accumulate(
    spec: AnalysisSpec,
    evidence: Evidence | None,
    canary: TrackCounts,
    stable: TrackCounts,
    *,
    generative: bool = False,
) -> Evidence:
    """The evidence after the counters `canary` and `stable` were read (pure).

    The increment since the last read goes into every test when both tracks answered
    requests in it. When only the canary did (the 100% step: stable serves nothing), its
    requests (and tokens) count towards the step's samples and nothing is tested. When a
    sum went back (a pod restarted or left), that track is read afresh and the increment
    is skipped. Whether an increment is used depends on request counts only, never on the
    events, so skipping keeps every test valid.
    """
    if evidence is None or evidence.canary is None or evidence.stable is None:
        return _start(spec, canary, stable, generative=generative)
    before_canary, before_stable = evidence.canary, evidence.stable
    if _went_back(before_canary, canary) or _went_back(before_stable, stable):
        fresh_canary = canary if _went_back(before_canary, canary) else before_canary
        fresh_stable = stable if _went_back(before_stable, stable) else before_stable
        return evidence.model_copy(update={"canary": fresh_canary, "stable": fresh_stable})
    served = canary.requests - before_canary.requests
    compared = stable.requests - before_stable.requests
    if served <= 0:
        return evidence
    tests = sequential_tests(spec, generative=generative)
    increments = (
        _increments((before_canary, canary), (before_stable, stable), generative=generative)
        if compared > 0
        else {}
    )
    checks = [
        _advanced(check, tests[check.name], increments.get(check.name))
        for check in evidence.checks
        if check.name in tests
    ]
    return evidence.model_copy(
        update={
            "canary": canary,
            "stable": stable if compared > 0 else before_stable,
            "step_samples": evidence.step_samples + served,
            "step_tokens": evidence.step_tokens + canary.tokens - before_canary.tokens,
            "checks": checks,
        }
    )


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


def _judged_at_interval_end(
    source: MetricSource, spec: AnalysisSpec, target: AnalysisTarget, evidence: Evidence | None
) -> AnalysisResult:
    """The step's verdict once its interval is over.

    It needs enough samples (and tokens), no rejection, a generative model's bounds and
    the user's checks within bounds.
    """
    samples = evidence.step_samples if evidence is not None else 0.0
    tokens = None
    if target.generative:
        tokens = evidence.step_tokens if evidence is not None else 0.0
    return gated_verdict(
        source,
        spec,
        target,
        own_checks(spec, target),
        requests=samples,
        tokens=tokens,
        span="this step",
        settled=_evidence_checks(evidence),
    )


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
        evidence = accumulate(spec, evidence, canary, stable, generative=generative)
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
    return evidence, _judged_at_interval_end(source, spec, target, evidence)
