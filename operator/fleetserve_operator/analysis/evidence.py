"""Sequential mode's evidence: what the tests make of the counters read at one look (pure).

`sequential_plan` states the tests of a rollout and their shares of α: one test against
stable per event kind (`count_tests`: errors, and request latency or, for a generative
model, time to first token and inter-token latency), one test per absolute bound
(`guardrails`: `maxErrorRate`, and the p99 bounds that are set), and one share for the
baseline of the 100% step; α is split evenly between them, so a canary no worse than stable
and within its bounds is rolled back with probability at most α in all. Each test against
stable carries a power gate (`power`) at β = 1 - `power`.

`accumulate` feeds the increase of both tracks' cumulative counters since the last look
into every test, and keeps the new `Evidence` (the state a restarted operator resumes from).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve_operator.analysis.count_tests import CountTest, Increment, exceedances
from fleetserve_operator.analysis.guardrails import QUANTILE_TAIL, BoundTest, bound_index
from fleetserve_operator.analysis.power import PowerGate, TrackSample
from fleetserve_operator.analysis.queries import (
    ERROR_RATE,
    ERROR_TEST,
    ITL,
    ITL_P99,
    LATENCY,
    P99_LATENCY,
    TTFT,
    TTFT_P99,
    HistogramTest,
    histogram_tests,
)
from fleetserve_operator.spec import (
    AnalysisSpec,
    CheckEvidence,
    Evidence,
    PowerEvidence,
    TrackCounts,
)

__all__ = ["BOUND_MIN_ANSWERS", "Guardrail", "SequentialPlan", "accumulate", "sequential_plan"]

BOUND_MIN_ANSWERS = 100
"""Stable answers a latency gate waits for before it picks its bound (stable's p99 bucket):
with fewer, 1% of them is not one answer."""


@dataclass(frozen=True, slots=True)
class Guardrail:
    """An absolute bound's test: on errors, or on answers slower than a histogram's bound.

    `histogram` None: errors; else answers slower than its bucket bound `index`.
    """

    test: BoundTest
    histogram: HistogramTest | None = None
    index: int = 0


@dataclass(frozen=True, slots=True)
class SequentialPlan:
    """The tests of a rollout in sequential mode, with their levels."""

    tests: dict[str, CountTest]
    """Against stable, by name: errors first, then the latency histograms."""
    histograms: dict[str, HistogramTest]
    """The latency tests' histograms, by test name."""
    guardrails: dict[str, Guardrail]
    gate: PowerGate
    baseline_delta: float
    """The level of each series' confidence bound on stable's baseline rate."""


def _guardrails(spec: AnalysisSpec, generative: bool) -> dict[str, tuple[HistogramTest, float]]:
    """The p99 bounds that are set, by check name (the names threshold mode gives them)."""
    bounds = (
        {TTFT_P99: (TTFT, spec.max_ttft_p99_ms), ITL_P99: (ITL, spec.max_itl_p99_ms)}
        if generative
        else {P99_LATENCY: (LATENCY, spec.max_p99_latency_ms)}
    )
    return {name: (test, ms) for name, (test, ms) in bounds.items() if ms is not None}


def sequential_plan(spec: AnalysisSpec, *, generative: bool = False) -> SequentialPlan:
    """The tests of a rollout, α split evenly over them and the 100% step's baseline."""
    latency = histogram_tests(generative)
    p99_bounds = _guardrails(spec, generative)
    alpha = spec.alpha / (len(latency) + 1 + len(p99_bounds) + 1 + 1)
    tests = {ERROR_TEST: CountTest(spec.error_tolerance, alpha)}
    for histogram in latency:
        tests[histogram.name] = CountTest(
            spec.latency_tolerance, alpha, series=len(histogram.bounds)
        )
    guardrails = {ERROR_RATE: Guardrail(BoundTest(spec.max_error_rate, alpha))}
    for name, (histogram, ms) in p99_bounds.items():
        index = bound_index(histogram.bounds, ms / 1000.0)
        guardrails[name] = Guardrail(BoundTest(QUANTILE_TAIL, alpha), histogram, index)
    series = sum(test.series for test in tests.values())
    return SequentialPlan(
        tests=tests,
        histograms={histogram.name: histogram for histogram in latency},
        guardrails=guardrails,
        gate=PowerGate(spec.min_detectable_ratio, 1.0 - spec.power),
        baseline_delta=alpha / series,
    )


def _buckets(counts: TrackCounts, test: HistogramTest) -> list[float]:
    buckets: list[float] = getattr(counts, test.field)
    return buckets


def _stable_bound(histogram: HistogramTest, stable: TrackCounts) -> float | None:
    """The first bucket bound with at most 1% of stable's answers above it (its p99 bucket).

    None before stable has `BOUND_MIN_ANSWERS` answers.
    """
    buckets = _buckets(stable, histogram)
    if not buckets or buckets[-1] < BOUND_MIN_ANSWERS:
        return None
    slower = exceedances(buckets)
    index = next(
        (i for i, count in enumerate(slower) if count <= QUANTILE_TAIL * buckets[-1]),
        len(slower) - 1,
    )
    return histogram.bounds[index]


def _start(
    plan: SequentialPlan, canary: TrackCounts, stable: TrackCounts, *, canary_from_now: bool
) -> Evidence:
    """Evidence before any increment: stable's counters from now, the canary's from 0.

    The canary's series exist at 0 from the moment its version loaded, so everything it
    answered counts; stable's history before the rollout is not comparable share by share,
    but it picks each latency gate's bound and is part of the 100% step's baseline. After a
    shadow stage (`canary_from_now`) the canary has answered the stable pods' copies, which
    are no step's traffic: its counters are taken from now too.
    """
    zero = (
        canary
        if canary_from_now
        else TrackCounts().model_copy(
            update={h.field: [0.0] * len(_buckets(canary, h)) for h in plan.histograms.values()}
        )
    )
    gate = plan.gate
    checks = []
    for name, test in plan.tests.items():
        histogram = plan.histograms.get(name)
        power = PowerEvidence(
            threshold=gate.threshold,
            log_likelihood_ratios=list(gate.start()),
            bound_s=None if histogram is None else _stable_bound(histogram, stable),
        )
        checks.append(
            CheckEvidence(
                name=name,
                threshold=test.threshold,
                log_likelihood_ratios=list(test.start()),
                power=power,
            )
        )
    checks += [
        CheckEvidence(
            name=name,
            threshold=guardrail.test.threshold,
            log_likelihood_ratios=list(guardrail.test.start()),
        )
        for name, guardrail in plan.guardrails.items()
    ]
    return Evidence(canary=zero, stable=stable, checks=checks)


def _went_back(before: TrackCounts, now: TrackCounts) -> bool:
    """A counter sum decreased: a pod restarted or left, so this increment is unknown."""
    pairs = [(before.requests, now.requests), (before.errors, now.errors)]
    pairs.append((before.tokens, now.tokens))
    for test in (LATENCY, TTFT, ITL):
        earlier, later = _buckets(before, test), _buckets(now, test)
        if len(earlier) == len(later):
            pairs += list(zip(earlier, later, strict=True))
    return any(after < prior for prior, after in pairs)


@dataclass(frozen=True, slots=True)
class _Reads:
    """Both tracks' counters before and now, and the baseline the canary is held to."""

    canary: tuple[TrackCounts, TrackCounts]
    stable: tuple[TrackCounts, TrackCounts]
    baseline: TrackCounts | None

    @property
    def served(self) -> float:
        return self.canary[1].requests - self.canary[0].requests

    @property
    def compared(self) -> float:
        return self.stable[1].requests - self.stable[0].requests


def _deltas(pair: tuple[TrackCounts, TrackCounts], test: HistogramTest) -> list[float]:
    """The increase of each cumulative bucket; [] when a read lacks the histogram."""
    earlier, later = (_buckets(counts, test) for counts in pair)
    if not earlier or len(earlier) != len(later):
        return []
    return [b - a for a, b in zip(earlier, later, strict=True)]


@dataclass(frozen=True, slots=True)
class _Series:
    """One test's increment: per track, its trials and events per series, and the weight."""

    canary: tuple[float, tuple[float, ...]]
    stable: tuple[float, tuple[float, ...]]
    weight: float = 1.0

    @property
    def increment(self) -> Increment:
        return Increment(
            self.canary[0], self.stable[0], self.canary[1], self.stable[1], self.weight
        )


def _error_series(reads: _Reads) -> _Series:
    (c0, c1), (s0, s1) = reads.canary, reads.stable
    return _Series(
        (reads.served, (c1.errors - c0.errors,)), (reads.compared, (s1.errors - s0.errors,))
    )


def _histogram_series(reads: _Reads, histogram: HistogramTest) -> _Series | None:
    """Answers per track and answers slower than each bound, between two reads.

    A `per_request` histogram's evidence is weighed by both tracks' requests over its
    counts (at most 1).
    """
    canary, stable = _deltas(reads.canary, histogram), _deltas(reads.stable, histogram)
    if not canary or not stable:
        return None
    counted = canary[-1] + stable[-1]
    requests = reads.served + reads.compared
    weight = min(1.0, requests / counted) if histogram.per_request and counted > 0 else 1.0
    return _Series((canary[-1], exceedances(canary)), (stable[-1], exceedances(stable)), weight)


def _baseline_series(
    baseline: TrackCounts, histogram: HistogramTest | None
) -> tuple[float, tuple[float, ...]]:
    """Stable's baseline trials and events per series of a test."""
    if histogram is None:
        return baseline.requests, (baseline.errors,)
    buckets = _buckets(baseline, histogram)
    return (buckets[-1], exceedances(buckets)) if buckets else (0.0, ())


def _gate_sample(
    side: tuple[float, tuple[float, ...]], histogram: HistogramTest | None, bound_s: float | None
) -> TrackSample | None:
    """The gate's series of one side: its errors, or answers slower than `bound_s`."""
    trials, events = side
    if histogram is None:
        return TrackSample(trials, events[0])
    if bound_s is None or not events:
        return None
    return TrackSample(trials, events[histogram.bounds.index(bound_s)])


def _advanced_power(
    power: PowerEvidence,
    gate: PowerGate,
    series: _Series,
    reads: _Reads,
    histogram: HistogramTest | None,
    seen: float,
) -> PowerEvidence:
    """The gate after an increment: the share when stable answered, else the baseline."""
    bound_s = power.bound_s
    if histogram is not None and bound_s is None:
        bound_s = _stable_bound(histogram, reads.stable[0])
    state = tuple(power.log_likelihood_ratios) or gate.start()
    canary = _gate_sample(series.canary, histogram, bound_s)
    stable = _gate_sample(series.stable, histogram, bound_s)
    reference = reads.stable[0] if reads.baseline is None else reads.baseline
    history = _gate_sample(_baseline_series(reference, histogram), histogram, bound_s)
    if canary is not None and stable is not None and canary.trials > 0:
        if stable.trials > 0:
            state = gate.update(state, canary, stable, series.weight)
        elif reads.baseline is not None and history is not None:
            state = gate.update_vs_baseline(state, canary, history, series.weight)
    kept = [round(value, 6) for value in state]
    e_value = float(f"{gate.e_value(kept):.6g}")
    cleared = power.cleared or e_value >= gate.threshold
    rate = history.rate if history is not None else None
    split = series.canary[0] / series.stable[0] if series.stable[0] > 0 else None
    needed = power.samples_needed
    if not cleared and canary is not None and canary.trials > 0:
        needed = gate.samples_needed(kept, seen, rate, split, series.weight)
    return power.model_copy(
        update={
            "log_likelihood_ratios": kept,
            "threshold": gate.threshold,
            "e_value": e_value,
            "cleared": cleared,
            "samples_needed": None if needed is None else round(needed),
            "baseline_rate": None if rate is None else float(f"{rate:.6g}"),
            "bound_s": bound_s,
        }
    )


def _advanced_test(
    check: CheckEvidence, plan: SequentialPlan, reads: _Reads, series: _Series | None
) -> CheckEvidence:
    """A test against stable after an increment, and its gate."""
    test, histogram = plan.tests[check.name], plan.histograms.get(check.name)
    if series is None or series.canary[0] <= 0:
        return check
    state = tuple(check.log_likelihood_ratios) or test.start()
    increment = series.increment
    used = True
    if increment.informative:
        state = test.update(state, increment)
    elif reads.baseline is not None:
        baseline = _baseline_series(reads.baseline, histogram)
        state = test.update_vs_baseline(state, increment, baseline, plan.baseline_delta)
    else:
        used = False
    kept = [round(value, 6) for value in state]
    e_value = float(f"{test.e_value(kept):.6g}")
    samples = check.samples + (increment.canary_requests if used else 0.0)
    power = check.power
    if power is not None:
        power = _advanced_power(power, plan.gate, series, reads, histogram, samples)
    return check.model_copy(
        update={
            "log_likelihood_ratios": kept,
            "e_value": e_value,
            "samples": samples,
            "threshold": test.threshold,
            "rejected": check.rejected or e_value >= test.threshold,
            "power": power,
        }
    )


def _advanced_guardrail(
    check: CheckEvidence, guardrail: Guardrail, series: _Series | None
) -> CheckEvidence:
    """An absolute bound's test after the canary's own increment."""
    if series is None or series.canary[0] <= 0:
        return check
    trials, events = series.canary
    test = guardrail.test
    state = test.update(
        check.log_likelihood_ratios or test.start(), events[guardrail.index], trials, series.weight
    )
    kept = [round(value, 6) for value in state]
    e_value = float(f"{test.e_value(kept):.6g}")
    return check.model_copy(
        update={
            "log_likelihood_ratios": kept,
            "e_value": e_value,
            "samples": check.samples + trials,
            "threshold": test.threshold,
            "rejected": check.rejected or e_value >= test.threshold,
        }
    )


def _advanced(evidence: Evidence, plan: SequentialPlan, reads: _Reads) -> list[CheckEvidence]:
    """Every test of the plan after the increment.

    A test the evidence lacks (a bound set during the rollout) starts from this increment;
    one the plan no longer has is left out.
    """
    series: dict[str, _Series | None] = {ERROR_TEST: _error_series(reads)}
    for name, histogram in plan.histograms.items():
        series[name] = _histogram_series(reads, histogram)
    kept = {check.name: check for check in evidence.checks}
    fresh = {
        check.name: check
        for check in _start(plan, TrackCounts(), reads.stable[0], canary_from_now=False).checks
    }
    checks = []
    for name, check in ((name, kept.get(name, fresh[name])) for name in fresh):
        if name in plan.tests:
            checks.append(_advanced_test(check, plan, reads, series[name]))
        else:
            guardrail = plan.guardrails[name]
            source = ERROR_TEST if guardrail.histogram is None else guardrail.histogram.name
            checks.append(_advanced_guardrail(check, guardrail, series[source]))
    return checks


def accumulate(
    spec: AnalysisSpec,
    evidence: Evidence | None,
    canary: TrackCounts,
    stable: TrackCounts,
    *,
    generative: bool = False,
    canary_alone: bool = False,
    canary_from_now: bool = False,
) -> Evidence:
    """The evidence after the counters `canary` and `stable` were read (pure).

    The increment since the last read goes into every test when both tracks answered
    requests in it, and into the absolute bounds' tests whenever the canary did. When the
    canary carries all the traffic (`canary_alone`) and stable answered nothing, stable's
    counters as last taken in become the baseline, fixed from then on, and the tests hold
    the canary's increments to it. `canary_from_now`: the canary's counters at the first
    read are its starting point (after a shadow stage), not 0. When a sum went back (a pod
    restarted or left), that track is read afresh and the increment is skipped. Whether an
    increment is used depends on request counts only, never on the events, so skipping
    keeps every test valid.
    """
    plan = sequential_plan(spec, generative=generative)
    if evidence is None or evidence.canary is None or evidence.stable is None:
        return _start(plan, canary, stable, canary_from_now=canary_from_now)
    before_canary, before_stable = evidence.canary, evidence.stable
    if _went_back(before_canary, canary) or _went_back(before_stable, stable):
        fresh_canary = canary if _went_back(before_canary, canary) else before_canary
        fresh_stable = stable if _went_back(before_stable, stable) else before_stable
        return evidence.model_copy(update={"canary": fresh_canary, "stable": fresh_stable})
    if canary.requests <= before_canary.requests:
        return evidence
    baseline = evidence.baseline
    compared = stable.requests > before_stable.requests
    if baseline is None and canary_alone and not compared:
        baseline = before_stable
    reads = _Reads((before_canary, canary), (before_stable, stable), baseline)
    return evidence.model_copy(
        update={
            "canary": canary,
            "stable": stable if compared else before_stable,
            "baseline": baseline,
            "step_samples": evidence.step_samples + reads.served,
            "step_tokens": evidence.step_tokens + canary.tokens - before_canary.tokens,
            "checks": _advanced(evidence, plan, reads),
        }
    )
