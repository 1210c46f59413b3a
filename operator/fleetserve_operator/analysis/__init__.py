"""Canary analysis: metric reads from Prometheus, and verdicts on a canary against stable.

`sync` reads the runtime's measured memory figures here for the memory-budget check
(`read_memory_figures`). For a rollout it builds the `target_for` the canary, which compares
the canary with the stable track by the `track` label, and then, by `analysis.mode`:

- `threshold`: when `rollout.is_analysis_due` says an interval has passed, `evaluate` judges
  one window against fixed bounds and returns an `AnalysisResult` for `rollout.next_step`;
- `sequential`: at every look (`rollout.is_watching`), `watch` reads both tracks' cumulative
  counters and feeds the increases since the last look into anytime-valid tests
  (`evidence`), returning the new `Evidence`, with an `AnalysisResult` when a test rejected
  (a Failed verdict at once) or the interval is over. A step before more than half of the
  traffic, or before promotion, also needs the power gates cleared (`power`); until then
  it is `InsufficientEvidence` and holds.

The model's task (`spec.model.task`) chooses the checks: an encoder is judged on request
latency and queue wait; a generative model per token, on time to first token and
inter-token latency (tests on both histograms in sequential mode, p99 bounds in threshold
mode), preemptions and tokens per second per replica, and its sample gate counts generated
tokens as well as requests. Errors and 503/504 rejections are judged for both. The absolute
bounds (`maxErrorRate`, the p99 bounds) apply in both modes: as windows in threshold mode,
as anytime-valid tests of the canary's own rates in sequential mode (`guardrails`).

"No data" is its own outcome everywhere, never a failure: a query with no series, or NaN, is
`NoData`; an unreachable Prometheus or a failed query is `QueryError`/`PrometheusDown`; both
make the analysis inconclusive.

Modules, highest first (a module imports only those below it; `|`: independent):

    threshold | sequential | reads   the two modes, and the reads outside an analysis
    verdict | evidence               checks judged into the `AnalysisResult` the rollout takes;
                                     the sequential tests' evidence from two reads (pure)
    prometheus | queries | power | guardrails
                                     the HTTP client; the PromQL text; the power gate; the
                                     absolute bounds' tests
    count_tests                      the tests against stable
    rates                            likelihood ratios and confidence bounds

This package re-exports what the rest of the operator and the tests use.
"""

from __future__ import annotations

from fleetserve_operator.analysis.evidence import SequentialPlan, accumulate, sequential_plan
from fleetserve_operator.analysis.prometheus import MetricSource, PrometheusSource
from fleetserve_operator.analysis.queries import (
    ERROR_TEST,
    ITL,
    ITL_TEST,
    LATENCY,
    LATENCY_TEST,
    REJECTIONS,
    SERVER_ERRORS,
    TTFT,
    TTFT_TEST,
    AnalysisTarget,
    HistogramTest,
    TrackScope,
    buckets_query,
    code_ratio_query,
    codes_query,
    generated_query,
    histogram_tests,
    memory_query,
    p99_ms_query,
    per_request_query,
    promql_duration,
    requests_query,
    target_for,
    tokens_per_replica_query,
    tokens_query,
)
from fleetserve_operator.analysis.reads import read_memory_figures, read_stable_error_ratio
from fleetserve_operator.analysis.sequential import read_counts, watch
from fleetserve_operator.analysis.threshold import evaluate, plan_checks
from fleetserve_operator.analysis.verdict import PlannedCheck, generative_bounds

__all__ = [
    "ERROR_TEST",
    "ITL",
    "ITL_TEST",
    "LATENCY",
    "LATENCY_TEST",
    "REJECTIONS",
    "SERVER_ERRORS",
    "TTFT",
    "TTFT_TEST",
    "AnalysisTarget",
    "HistogramTest",
    "MetricSource",
    "PlannedCheck",
    "PrometheusSource",
    "SequentialPlan",
    "TrackScope",
    "accumulate",
    "buckets_query",
    "code_ratio_query",
    "codes_query",
    "evaluate",
    "generated_query",
    "generative_bounds",
    "histogram_tests",
    "memory_query",
    "p99_ms_query",
    "per_request_query",
    "plan_checks",
    "promql_duration",
    "read_counts",
    "read_memory_figures",
    "read_stable_error_ratio",
    "requests_query",
    "sequential_plan",
    "target_for",
    "tokens_per_replica_query",
    "tokens_query",
    "watch",
]
