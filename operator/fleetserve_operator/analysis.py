"""Metric reads from Prometheus behind a small `MetricSource` protocol, and canary analysis.

`sync` reads the runtime's measured memory figures here for the memory-budget check. For a
rollout it asks `rollout.is_analysis_due` whether an analysis is due and, if so, builds the
`target_for` the canary and calls `evaluate`, which compares the canary with the stable track by
the `track` label over one window and returns an `AnalysisResult` for `rollout.next_step`. Tests
feed numbers through `testing.FakeMetricSource`/`ScriptedMetricSource` instead of a Prometheus.

"No data" is its own outcome everywhere, never a failure (flagger counts "no values found" as a
failed check; Argo errors on an empty result): a query with no series, or NaN, is `NoData`; an
unreachable Prometheus or a failed query is `QueryError`/`PrometheusDown`; both make the
analysis inconclusive. Fewer than `minRequests` canary requests is inconclusive too, so a 1%
step with little traffic never passes on noise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

import requests
import urllib3

from fleetserve_operator.contract import (
    QUEUE_WAIT_METRIC,
    REQUEST_DURATION_METRIC,
    REQUESTS_METRIC,
    MemoryMetric,
)
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.naming import Track
from fleetserve_operator.records import MemoryFigures
from fleetserve_operator.spec import (
    AnalysisResult,
    AnalysisSpec,
    CheckOutcome,
    CheckResult,
    InconclusiveReason,
    InferenceServiceSpec,
    InferenceServiceStatus,
    Verdict,
    parse_duration_s,
)

__all__ = [
    "REJECTIONS",
    "SERVER_ERRORS",
    "AnalysisTarget",
    "MetricSource",
    "PlannedCheck",
    "PrometheusSource",
    "TrackScope",
    "code_ratio_query",
    "evaluate",
    "memory_query",
    "p99_ms_query",
    "plan_checks",
    "promql_duration",
    "read_memory_figures",
    "read_stable_error_ratio",
    "requests_query",
    "target_for",
]

SERVER_ERRORS = "5.."
REJECTIONS = "503|504"  # the runtime's QueueFull (503) and DeadlineExceeded (504)


class MetricSource(Protocol):
    """Where PromQL results come from."""

    def query(self, promql: str) -> float | None:
        """The single value of an instant query; None when it returns no series."""
        ...

    def is_online(self) -> bool:
        """Whether the source answers at all."""
        ...


class PrometheusSource:
    """A `MetricSource` over Prometheus's HTTP API (`GET /api/v1/query`).

    Nothing Prometheus sends is repeated: a failure is reported as the HTTP status code and
    its standard phrase, or a fixed reason, never the body or the server's own reason text,
    so status and Events publish nothing fetched (they are readable by everyone who may read
    the InferenceService). Redirects are not followed: an allowed URL must not lead to one
    that is not. A body longer than `MAX_BODY_BYTES` is a failure, and no more of it is read.
    """

    MAX_BODY_BYTES = 4 * 2**20

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s

    def _failure(self, reason: str) -> MetricsUnavailable:
        return MetricsUnavailable(f"Prometheus {self.url}: {reason}")

    def _get(self, path: str, params: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status code, body) of one GET; raises `MetricsUnavailable` when none came."""
        try:
            # No retries: a failed query is an inconclusive check, and the next reconcile
            # asks again; retrying here would only stall the reconcile.
            with requests.get(
                self.url + path,
                params=params,
                timeout=self._timeout_s,
                allow_redirects=False,
                stream=True,
            ) as response:
                body = response.raw.read(self.MAX_BODY_BYTES + 1, decode_content=True)
                return response.status_code, body
        except (requests.Timeout, urllib3.exceptions.TimeoutError):
            raise self._failure(f"no answer within {self._timeout_s:g} s") from None
        except requests.ConnectionError:
            raise self._failure("could not connect") from None
        # The body is read from urllib3 directly, whose errors are not requests'.
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._failure(f"request failed ({type(exc).__name__})") from None

    def query(self, promql: str) -> float | None:
        """The first series' value of `promql`; raises `MetricsUnavailable` on any failure."""
        status, body = self._get("/api/v1/query", {"query": promql})
        if status != HTTPStatus.OK:
            raise self._failure(f"answered HTTP {_status_text(status)}")
        if len(body) > self.MAX_BODY_BYTES:
            raise self._failure(f"answered more than {self.MAX_BODY_BYTES} bytes")
        try:
            return _instant_value(json.loads(body)["data"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._failure("answered HTTP 200 without an instant-query result") from None

    def is_online(self) -> bool:
        """Whether Prometheus answers at all (its `/` redirects to the UI: that counts)."""
        try:
            status, _ = self._get("/")
        except MetricsUnavailable:
            return False
        return status < HTTPStatus.BAD_REQUEST


def _status_text(code: int) -> str:
    """`503 Service Unavailable`: the standard phrase, never the one the server sent."""
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def _instant_value(data: Any) -> float | None:
    """The value of an instant query's `data`: a vector's first sample, or a scalar."""
    result = data["result"]
    if data["resultType"] == "scalar":
        return float(result[1])
    if not result:
        return None
    return float(result[0]["value"][1])


def memory_query(metric: str, *, namespace: str, model: str, version: str) -> str:
    """PromQL for one memory gauge of the stable track of `model` at `version`.

    `namespace` is the scrape target's namespace label (added by Kubernetes service
    discovery, a PodMonitor, or the e2e harness); the runtime adds model/version/track.
    """
    selector = f'namespace="{namespace}",model="{model}",version="{version}",track="{Track.STABLE}"'
    return f"max({metric}{{{selector}}})"


def read_memory_figures(
    source: MetricSource, *, namespace: str, model: str, version: str
) -> MemoryFigures | None:
    """What the stable track measured for its model; None until a replica has reported it."""
    values = [
        source.query(memory_query(metric, namespace=namespace, model=model, version=version))
        for metric in (MemoryMetric.WEIGHTS, MemoryMetric.FIXED, MemoryMetric.PER_TOKEN)
    ]
    weights, fixed, per_token = values
    if weights is None or fixed is None or per_token is None:
        return None
    return MemoryFigures(weights_bytes=weights, fixed_bytes=fixed, bytes_per_token=per_token)


@dataclass(frozen=True, slots=True)
class TrackScope:
    """The series of one track: the scrape's `namespace` plus the runtime's labels."""

    namespace: str
    model: str
    version: str
    track: Track
    offset: str | None = None
    """Read the window this long ago (the stable baseline at the 100% step, where the
    stable track gets no traffic)."""

    def selector(self, extra: str = "") -> str:
        """The label matchers, e.g. `namespace="ns",model="m",version="2",track="canary"`."""
        labels = (
            f'namespace="{self.namespace}",model="{self.model}",'
            f'version="{self.version}",track="{self.track}"'
        )
        return f"{labels},{extra}" if extra else labels

    def range(self, window: str) -> str:
        """`[window]`, with the offset modifier when one is set (both as PromQL spells them)."""
        selected = f"[{promql_duration(window)}]"
        return f"{selected} offset {promql_duration(self.offset)}" if self.offset else selected


def promql_duration(duration: str) -> str:
    """A spec duration as PromQL takes it: whole seconds (`1.5m` → `90s`), else milliseconds.

    PromQL refuses a fraction (`[1.5m]` is a parse error, so every query would fail and no
    analysis would ever be conclusive) and a zero range; the shortest range is `1ms`.
    """
    ms = max(1, round(parse_duration_s(duration) * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(frozen=True, slots=True)
class AnalysisTarget:
    """What one analysis compares: the canary with the stable track, over one window."""

    canary: TrackScope
    stable: TrackScope
    window: str
    """The spec's duration, e.g. `1m` (`analysis.window`, else the rollout interval);
    queries spell it with `promql_duration`."""
    queue_wait_floor_ms: float = 0.0
    """Queue waits up to this are by design (the batcher's `maxQueueDelayMs`), so the
    queue-wait ratio check never fails below it."""


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


def target_for(
    spec: InferenceServiceSpec, status: InferenceServiceStatus, *, namespace: str
) -> AnalysisTarget:
    """The canary and stable series a rollout's analysis compares now.

    At 100% the stable track gets no traffic, so its baseline is read from the window
    before (`offset`), when it still served most requests.
    """
    window = (spec.rollout.analysis and spec.rollout.analysis.window) or spec.rollout.interval
    model = spec.model.name
    canary = TrackScope(namespace, model, status.canary_version or spec.model.version, Track.CANARY)
    stable = TrackScope(
        namespace,
        model,
        status.stable_version or "",
        Track.STABLE,
        offset=window if status.canary_weight == 100 else None,
    )
    return AnalysisTarget(
        canary, stable, window, queue_wait_floor_ms=spec.batching.max_queue_delay_ms
    )


def requests_query(scope: TrackScope, window: str) -> str:
    """Requests the track answered in the window."""
    return f"sum(increase({REQUESTS_METRIC}{{{scope.selector()}}}{scope.range(window)}))"


def code_ratio_query(scope: TrackScope, window: str, codes: str) -> str:
    """Share of the track's answers whose status matches `codes` (a regex such as `5..`).

    `or vector(0)`: with no such answer there is no such series, and an empty numerator
    would make a healthy track look like "no data".
    """
    code = f'code=~"{codes}"'
    matching = f"{REQUESTS_METRIC}{{{scope.selector(code)}}}{scope.range(window)}"
    every = f"{REQUESTS_METRIC}{{{scope.selector()}}}{scope.range(window)}"
    return f"(sum(rate({matching})) or vector(0)) / sum(rate({every}))"


def p99_ms_query(histogram: str, scope: TrackScope, window: str) -> str:
    """The track's p99 of a seconds histogram, in milliseconds."""
    buckets = f"{histogram}_bucket{{{scope.selector()}}}{scope.range(window)}"
    return f"1000 * histogram_quantile(0.99, sum by (le) (rate({buckets})))"


def _custom_query(template: str, scope: TrackScope, window: str) -> str:
    values = {
        "$namespace": scope.namespace,
        "$model": scope.model,
        "$version": scope.version,
        "$track": scope.track.value,
        "$window": promql_duration(window),
    }
    for placeholder, value in values.items():
        template = template.replace(placeholder, value)
    return template


def plan_checks(spec: AnalysisSpec, target: AnalysisTarget) -> list[PlannedCheck]:
    """The built-in checks (errors, latency, queue wait, rejections) and `spec.checks`."""
    canary, stable, window = target.canary, target.stable, target.window
    planned = [
        PlannedCheck(
            "error-rate",
            code_ratio_query(canary, window, SERVER_ERRORS),
            max=spec.max_error_rate,
        ),
        PlannedCheck(
            "p99-latency-vs-stable",
            p99_ms_query(REQUEST_DURATION_METRIC, canary, window),
            baseline=p99_ms_query(REQUEST_DURATION_METRIC, stable, window),
            factor=spec.max_latency_ratio_vs_stable,
        ),
        PlannedCheck(
            "queue-wait-p99-vs-stable",
            p99_ms_query(QUEUE_WAIT_METRIC, canary, window),
            baseline=p99_ms_query(QUEUE_WAIT_METRIC, stable, window),
            factor=spec.max_queue_wait_ratio_vs_stable,
            floor=target.queue_wait_floor_ms,
        ),
        # Stable's rejection ratio is usually 0, and any multiple of 0 is 0: the error
        # budget is the floor, so a canary may reject what it may fail.
        PlannedCheck(
            "rejection-ratio-vs-stable",
            code_ratio_query(canary, window, REJECTIONS),
            baseline=code_ratio_query(stable, window, REJECTIONS),
            factor=spec.max_rejection_ratio_vs_stable,
            floor=spec.max_error_rate,
        ),
    ]
    if spec.max_p99_latency_ms is not None:
        latency = p99_ms_query(REQUEST_DURATION_METRIC, canary, window)
        planned.insert(1, PlannedCheck("p99-latency", latency, max=spec.max_p99_latency_ms))
    for check in spec.checks:
        query = _custom_query(check.query, canary, window)
        planned.append(PlannedCheck(check.name, query, min=check.min, max=check.max))
    return planned


def _value(source: MetricSource, promql: str) -> float | None:
    """The query's value; NaN (0/0, a quantile of no samples) is no data, like no series."""
    value = source.query(promql)
    return None if value is None or math.isnan(value) else value


def _judge(source: MetricSource, planned: PlannedCheck) -> CheckResult:
    name = planned.name
    try:
        value = _value(source, planned.query)
        baseline = None if planned.baseline is None else _value(source, planned.baseline)
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
    if check.value is None:
        return f"{check.name}: {check.outcome.value}"
    bounds = [f">= {check.min:.4g}" if check.min is not None else ""]
    bounds.append(f"<= {check.max:.4g}" if check.max is not None else "")
    return f"{check.name} {check.value:.4g} (wanted {' and '.join(b for b in bounds if b)})"


def _verdict(checks: list[CheckResult], requests: float) -> AnalysisResult:
    """Failed on any definite violation; else inconclusive on any missing value; else passed."""
    failed = [c for c in checks if c.outcome is CheckOutcome.FAILED]
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
        verdict=verdict, reason=reason, message=message, requests=requests, checks=checks
    )


def _inconclusive(
    reason: InconclusiveReason, message: str, requests: float | None = None
) -> AnalysisResult:
    return AnalysisResult(
        verdict=Verdict.INCONCLUSIVE, reason=reason, message=message, requests=requests
    )


def evaluate(source: MetricSource, spec: AnalysisSpec, target: AnalysisTarget) -> AnalysisResult:
    """Judge the canary over `target.window`: Passed, Failed, or Inconclusive with a reason."""
    if not source.is_online():
        return _inconclusive(InconclusiveReason.PROMETHEUS_DOWN, "Prometheus did not answer")
    try:
        requests = _value(source, requests_query(target.canary, target.window))
    except MetricsUnavailable as exc:
        return _inconclusive(InconclusiveReason.QUERY_ERROR, str(exc))
    if requests is None or requests < spec.min_requests:
        seen = 0.0 if requests is None else requests
        message = f"{seen:.0f} canary requests in {target.window}, fewer than {spec.min_requests}"
        return _inconclusive(InconclusiveReason.TOO_FEW_REQUESTS, message, requests)
    return _verdict([_judge(source, planned) for planned in plan_checks(spec, target)], requests)


def read_stable_error_ratio(source: MetricSource, scope: TrackScope, window: str) -> float | None:
    """The stable track's 5xx ratio over `window` for the fallback trigger; None: no data.

    An unreachable Prometheus is no data too: failover on errors needs evidence (failover
    on missing replicas does not need Prometheus at all).
    """
    try:
        return _value(source, code_ratio_query(scope, window, SERVER_ERRORS))
    except MetricsUnavailable:
        return None
