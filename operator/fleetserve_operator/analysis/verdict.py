"""Checks judged into the `AnalysisResult` that `rollout.next_step` consumes.

Both modes end here: a `PlannedCheck` (a canary query and its bounds, fixed or relative to
stable) is judged against the source (`judge`), and the checks become one verdict
(`verdict_of`): Failed on any definite violation, else Inconclusive on any missing value,
else Passed. "No data" is its own outcome everywhere, never a failure (flagger counts "no
values found" as a failed check; Argo errors on an empty result). Fewer than `minRequests`
canary requests (or `minTokens` tokens) is inconclusive too (`too_few_samples`), so a 1% step with
little traffic never passes on noise. `gated_verdict` is that gate, then the verdict: the last
step of both modes.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve_operator.analysis.prometheus import MetricSource, value_of
from fleetserve_operator.analysis.queries import (
    GAP_CHECKS,
    ITL,
    ITL_P99,
    TTFT_P99,
    AnalysisTarget,
    custom_query,
    p99_ms_query,
    per_request_query,
    tokens_per_replica_query,
)
from fleetserve_operator.contract import (
    INTER_TOKEN_LATENCY_METRIC,
    PREEMPTIONS_METRIC,
    TIME_TO_FIRST_TOKEN_METRIC,
)
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.spec import (
    AnalysisResult,
    AnalysisSpec,
    CheckOutcome,
    CheckResult,
    InconclusiveReason,
    Verdict,
)

__all__ = [
    "PlannedCheck",
    "custom_checks",
    "gated_verdict",
    "generative_bounds",
    "inconclusive",
    "judge",
    "own_checks",
    "prometheus_down",
    "too_few_samples",
    "verdict_of",
]


@dataclass(frozen=True, slots=True)
class PlannedCheck:
    """One check to run: the canary's query and its bounds, fixed or relative to stable."""

    name: str
    query: str
    min: float | None = None
    max: float | None = None
    baseline: str | None = None
    """Stable's query; when set, the upper bound is `max(factor × stable, floor)`."""
    factor: float = 1.0
    floor: float = 0.0


def generative_bounds(spec: AnalysisSpec, target: AnalysisTarget) -> list[PlannedCheck]:
    """A generative canary's own bounds, judged in both modes (unset ones left out).

    TTFT and ITL p99 in ms, preemptions per request, tokens per second per replica.
    """
    canary, window = target.canary, target.window
    bounded = [
        (TTFT_P99, p99_ms_query(TIME_TO_FIRST_TOKEN_METRIC, canary, window),
         None, spec.max_ttft_p99_ms),
        (ITL_P99, p99_ms_query(INTER_TOKEN_LATENCY_METRIC, canary, window),
         None, spec.max_itl_p99_ms),
        ("preemption-rate", per_request_query(PREEMPTIONS_METRIC, canary, window),
         None, spec.max_preemption_rate),
        ("tokens-per-second-per-replica", tokens_per_replica_query(canary, window),
         spec.min_tokens_per_second_per_replica, None),
    ]  # fmt: skip
    return [
        PlannedCheck(name, query, min=low, max=high)
        for name, query, low, high in bounded
        if low is not None or high is not None
    ]


def custom_checks(spec: AnalysisSpec, target: AnalysisTarget) -> list[PlannedCheck]:
    """`spec.checks`, their placeholders filled in for the canary."""
    return [
        PlannedCheck(c.name, custom_query(c.query, target.canary, target.window),
                     min=c.min, max=c.max)
        for c in spec.checks
    ]  # fmt: skip


def own_checks(spec: AnalysisSpec, target: AnalysisTarget) -> list[PlannedCheck]:
    """The checks both modes judge by query: a generative model's bounds, then `spec.checks`."""
    bounds = generative_bounds(spec, target) if target.generative else []
    return [*bounds, *custom_checks(spec, target)]


def judge(source: MetricSource, planned: PlannedCheck) -> CheckResult:
    """One check's outcome: a failed query is QueryError, a missing value NoData."""
    name = planned.name
    try:
        value = value_of(source, planned.query)
        baseline = None if planned.baseline is None else value_of(source, planned.baseline)
    except MetricsUnavailable:
        return CheckResult(
            name=name, min=planned.min, max=planned.max, outcome=CheckOutcome.QUERY_ERROR
        )
    upper = planned.max
    if planned.baseline is not None:
        upper = None if baseline is None else max(planned.factor * baseline, planned.floor)
    if value is None or (planned.baseline is not None and upper is None):
        return CheckResult(
            name=name, value=value, min=planned.min, max=upper, outcome=CheckOutcome.NO_DATA
        )
    passed = (planned.min is None or value >= planned.min) and (upper is None or value <= upper)
    outcome = CheckOutcome.PASSED if passed else CheckOutcome.FAILED
    return CheckResult(name=name, value=value, min=planned.min, max=upper, outcome=outcome)


def _describe(check: CheckResult) -> str:
    if check.e_value is not None and check.threshold is not None:
        relation = ">=" if check.outcome is CheckOutcome.REJECTED else "<"
        unit = ITL.unit if check.name in GAP_CHECKS else "requests"
        return (
            f"{check.name} e-value {check.e_value:.4g} {relation} {check.threshold:.4g} "
            f"after {check.samples or 0:.0f} canary {unit}"
        )
    if check.value is None:
        return f"{check.name}: {check.outcome.value}"
    bounds = [f">= {check.min:.4g}" if check.min is not None else ""]
    bounds.append(f"<= {check.max:.4g}" if check.max is not None else "")
    return f"{check.name} {check.value:.4g} (wanted {' and '.join(b for b in bounds if b)})"


def verdict_of(
    checks: list[CheckResult], requests: float | None, tokens: float | None = None
) -> AnalysisResult:
    """Failed on any definite violation; else inconclusive on any missing value; else passed."""
    failed = [c for c in checks if c.outcome in (CheckOutcome.FAILED, CheckOutcome.REJECTED)]
    missing = [c for c in checks if c.outcome in (CheckOutcome.NO_DATA, CheckOutcome.QUERY_ERROR)]
    if failed:
        verdict, reason, named = Verdict.FAILED, None, failed
    elif missing:
        errors = any(c.outcome is CheckOutcome.QUERY_ERROR for c in missing)
        reason = InconclusiveReason.QUERY_ERROR if errors else InconclusiveReason.NO_DATA
        verdict, named = Verdict.INCONCLUSIVE, missing
    else:
        verdict, reason, named = Verdict.PASSED, None, checks
    message = "; ".join(_describe(check) for check in named)
    return AnalysisResult(
        verdict=verdict,
        reason=reason,
        message=message,
        requests=requests,
        tokens=tokens,
        checks=checks,
    )


def inconclusive(
    reason: InconclusiveReason,
    message: str,
    requests: float | None = None,
    tokens: float | None = None,
) -> AnalysisResult:
    """An Inconclusive result for `reason`."""
    return AnalysisResult(
        verdict=Verdict.INCONCLUSIVE,
        reason=reason,
        message=message,
        requests=requests,
        tokens=tokens,
    )


def prometheus_down() -> AnalysisResult:
    """Inconclusive, as Prometheus did not answer its health check."""
    return inconclusive(InconclusiveReason.PROMETHEUS_DOWN, "Prometheus did not answer")


def too_few_samples(
    spec: AnalysisSpec,
    target: AnalysisTarget,
    requests: float | None,
    tokens: float | None,
    span: str,
) -> AnalysisResult | None:
    """The min-sample gate: an inconclusive result, or None when there is enough.

    Enough is `minRequests` canary requests and, for a generative model, `minTokens`
    generated tokens.
    """
    if requests is None or requests < spec.min_requests:
        message = f"{requests or 0:.0f} canary requests in {span}, fewer than {spec.min_requests}"
        return inconclusive(InconclusiveReason.TOO_FEW_REQUESTS, message, requests, tokens)
    if target.generative and (tokens is None or tokens < spec.min_tokens):
        message = f"{tokens or 0:.0f} canary tokens in {span}, fewer than {spec.min_tokens}"
        return inconclusive(InconclusiveReason.TOO_FEW_TOKENS, message, requests, tokens)
    return None


def gated_verdict(
    source: MetricSource,
    spec: AnalysisSpec,
    target: AnalysisTarget,
    planned: list[PlannedCheck],
    *,
    requests: float | None,
    tokens: float | None,
    span: str,
) -> AnalysisResult:
    """The min-sample gate over `span`; past it, `planned` judged into a verdict.

    Nothing is queried for a step that has too few samples.
    """
    too_few = too_few_samples(spec, target, requests, tokens, span)
    if too_few is not None:
        return too_few
    return verdict_of([judge(source, check) for check in planned], requests, tokens)
