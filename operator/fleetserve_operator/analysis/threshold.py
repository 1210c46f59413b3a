"""Threshold mode: once per interval, one window of the canary judged against fixed bounds.

When `rollout.is_analysis_due` says an interval has passed, `evaluate` judges the window
(`plan_checks`: errors and rejections for every model; request latency and queue wait for
an encoder; TTFT and ITL p99 for a generative model, and its own bounds; the user's
`spec.checks`) and returns the `AnalysisResult` for `rollout.next_step`.
"""

from __future__ import annotations

from fleetserve_operator.analysis.prometheus import MetricSource, value_of
from fleetserve_operator.analysis.queries import (
    ERROR_RATE,
    P99_LATENCY,
    REJECTIONS,
    SERVER_ERRORS,
    AnalysisTarget,
    code_ratio_query,
    p99_ms_query,
    requests_query,
    tokens_query,
)
from fleetserve_operator.analysis.verdict import (
    PlannedCheck,
    gated_verdict,
    inconclusive,
    own_checks,
    prometheus_down,
)
from fleetserve_operator.contract import (
    INTER_TOKEN_LATENCY_METRIC,
    QUEUE_WAIT_METRIC,
    REQUEST_DURATION_METRIC,
    TIME_TO_FIRST_TOKEN_METRIC,
)
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.spec import AnalysisResult, AnalysisSpec, InconclusiveReason

__all__ = ["evaluate", "plan_checks"]


def _ratio_check(
    name: str, histogram: str, target: AnalysisTarget, factor: float, floor: float = 0.0
) -> PlannedCheck:
    """The canary's p99 of `histogram` against `factor` × stable's (at least `floor`)."""
    return PlannedCheck(
        name,
        p99_ms_query(histogram, target.canary, target.window),
        baseline=p99_ms_query(histogram, target.stable, target.window),
        factor=factor,
        floor=floor,
    )


def plan_checks(spec: AnalysisSpec, target: AnalysisTarget) -> list[PlannedCheck]:
    """The built-in checks and `spec.checks`, for threshold mode.

    Errors and rejections for every model; request latency and queue wait for an encoder;
    for a generative model (whose request latency is the length of a stream, and which has
    no batcher queue) TTFT and ITL p99, against stable and absolute, and its own bounds.
    """
    canary, stable, window = target.canary, target.stable, target.window
    planned = [
        PlannedCheck(
            ERROR_RATE,
            code_ratio_query(canary, window, SERVER_ERRORS),
            max=spec.max_error_rate,
        )
    ]
    if target.generative:
        planned += [
            _ratio_check("ttft-p99-vs-stable", TIME_TO_FIRST_TOKEN_METRIC, target,
                         spec.max_ttft_ratio_vs_stable),
            _ratio_check("itl-p99-vs-stable", INTER_TOKEN_LATENCY_METRIC, target,
                         spec.max_itl_ratio_vs_stable),
        ]  # fmt: skip
    else:
        if spec.max_p99_latency_ms is not None:
            latency = p99_ms_query(REQUEST_DURATION_METRIC, canary, window)
            planned.append(PlannedCheck(P99_LATENCY, latency, max=spec.max_p99_latency_ms))
        planned += [
            _ratio_check("p99-latency-vs-stable", REQUEST_DURATION_METRIC, target,
                         spec.max_latency_ratio_vs_stable),
            _ratio_check("queue-wait-p99-vs-stable", QUEUE_WAIT_METRIC, target,
                         spec.max_queue_wait_ratio_vs_stable, target.queue_wait_floor_ms),
        ]  # fmt: skip
    # Stable's rejection ratio is usually 0, and any multiple of 0 is 0: the error
    # budget is the floor, so a canary may reject what it may fail.
    planned.append(
        PlannedCheck(
            "rejection-ratio-vs-stable",
            code_ratio_query(canary, window, REJECTIONS),
            baseline=code_ratio_query(stable, window, REJECTIONS),
            factor=spec.max_rejection_ratio_vs_stable,
            floor=spec.max_error_rate,
        )
    )
    return [*planned, *own_checks(spec, target)]


def evaluate(source: MetricSource, spec: AnalysisSpec, target: AnalysisTarget) -> AnalysisResult:
    """Judge the canary over `target.window`: Passed, Failed, or Inconclusive with a reason."""
    if not source.is_online():
        return prometheus_down()
    try:
        requests = value_of(source, requests_query(target.canary, target.window))
        tokens = None
        if target.generative:
            tokens = value_of(source, tokens_query(target.canary, target.window))
    except MetricsUnavailable as exc:
        return inconclusive(InconclusiveReason.QUERY_ERROR, str(exc))
    planned = plan_checks(spec, target)
    return gated_verdict(
        source, spec, target, planned, requests=requests, tokens=tokens, span=target.window
    )
