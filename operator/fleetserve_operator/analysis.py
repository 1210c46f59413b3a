"""Metric reads from Prometheus behind a small `MetricSource` protocol, and canary analysis.

`sync` reads the runtime's measured memory figures here for the memory-budget check. For a
rollout it builds the `target_for` the canary, which compares the canary with the stable
track by the `track` label, and then, by `analysis.mode`:

- `threshold`: when `rollout.is_analysis_due` says an interval has passed, `evaluate` judges
  one window against fixed bounds and returns an `AnalysisResult` for `rollout.next_step`;
- `sequential`: at every look (`rollout.is_watching`), `watch` reads both tracks' cumulative
  counters (`read_counts`), feeds the increases since the last look into the anytime-valid
  tests of `sequential` (`accumulate`, pure) and returns the new `Evidence`, with an
  `AnalysisResult` when a test rejected (a Failed verdict at once) or the interval is over.

The model's task (`spec.model.task`) chooses the checks: an encoder is judged on request
latency and queue wait; a generative model per token, on time to first token and
inter-token latency (tests on both histograms in sequential mode, p99 bounds in threshold
mode), preemptions and tokens per second per replica, and its sample gate counts generated
tokens as well as requests. Errors and 503/504 rejections are judged for both.

Tests feed numbers through `testing.FakeMetricSource`/`ScriptedMetricSource` instead of a
Prometheus.

"No data" is its own outcome everywhere, never a failure (flagger counts "no values found" as a
failed check; Argo errors on an empty result): a query with no series, or NaN, is `NoData`; an
unreachable Prometheus or a failed query is `QueryError`/`PrometheusDown`; both make the
analysis inconclusive. Fewer than `minRequests` canary requests (or `minTokens` tokens) is
inconclusive too, so a 1% step with little traffic never passes on noise.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

import requests
import urllib3

from fleetserve_operator.contract import (
    GENERATION_TOKENS_METRIC,
    INTER_TOKEN_BOUNDS_S,
    INTER_TOKEN_LATENCY_METRIC,
    LATENCY_BOUNDS_S,
    PREEMPTIONS_METRIC,
    QUEUE_WAIT_METRIC,
    REQUEST_DURATION_METRIC,
    REQUESTS_METRIC,
    TIME_TO_FIRST_TOKEN_METRIC,
    MemoryMetric,
)
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.naming import Track
from fleetserve_operator.records import MemoryFigures
from fleetserve_operator.sequential import CountTest, Increment, exceedances
from fleetserve_operator.spec import (
    AnalysisResult,
    AnalysisSpec,
    CheckEvidence,
    CheckOutcome,
    CheckResult,
    Evidence,
    InconclusiveReason,
    InferenceServiceSpec,
    InferenceServiceStatus,
    TrackCounts,
    Verdict,
    parse_duration_s,
)

__all__ = [
    "ERROR_TEST",
    "ITL",
    "ITL_TEST",
    "LATENCY",
    "LATENCY_TEST",
    "TTFT",
    "TTFT_TEST",
    "HistogramTest",
    "REJECTIONS",
    "SERVER_ERRORS",
    "AnalysisTarget",
    "MetricSource",
    "PlannedCheck",
    "PrometheusSource",
    "TrackScope",
    "code_ratio_query",
    "buckets_query",
    "codes_query",
    "generated_query",
    "generative_bounds",
    "histogram_tests",
    "evaluate",
    "memory_query",
    "p99_ms_query",
    "plan_checks",
    "accumulate",
    "per_request_query",
    "promql_duration",
    "read_counts",
    "read_memory_figures",
    "read_stable_error_ratio",
    "requests_query",
    "tokens_query",
    "sequential_tests",
    "target_for",
    "tokens_per_replica_query",
    "watch",
]

SERVER_ERRORS = "5.."
REJECTIONS = "503|504"  # the runtime's QueueFull (503) and DeadlineExceeded (504)


class MetricSource(Protocol):
    """Where PromQL results come from."""

    def query(self, promql: str) -> float | None:
        """The single value of an instant query; None when it returns no series."""
        ...

    def query_by(self, promql: str, label: str) -> dict[str, float]:
        """An instant query's series values by their `label` value; {} with no series."""
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
        """(status code, body) of one GET; raises `MetricsUnavailable` when none came in time.

        Every wait (to connect, for the headers, for each part of the body) lasts at most
        `timeout_s`, and the body is given up once `timeout_s` have passed since the request
        began: a frozen Prometheus (stopped, or hung: the kernel accepts the connection and
        nothing answers) fails a query after `timeout_s`, one that trickles its answer after
        at most twice that. So a reconcile never waits on Prometheus for long, and a query
        that ran out of time is a failed query, never an answer.
        """
        deadline = time.monotonic() + self._timeout_s
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
                body = bytearray()
                while len(body) <= self.MAX_BODY_BYTES:
                    left = self.MAX_BODY_BYTES + 1 - len(body)
                    chunk = response.raw.read1(left, decode_content=True)
                    if not chunk:
                        break
                    body += chunk
                    if time.monotonic() > deadline:
                        raise self._failure(f"no whole answer within {self._timeout_s:g} s")
                return response.status_code, bytes(body)
        except (requests.Timeout, urllib3.exceptions.TimeoutError):
            raise self._failure(f"no answer within {self._timeout_s:g} s") from None
        except requests.ConnectionError:
            raise self._failure("could not connect") from None
        # The body is read from urllib3 directly, whose errors are not requests'.
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._failure(f"request failed ({type(exc).__name__})") from None

    def _data(self, promql: str) -> Any:
        """The `data` of an instant query's answer; raises `MetricsUnavailable` on failure."""
        status, body = self._get("/api/v1/query", {"query": promql})
        if status != HTTPStatus.OK:
            raise self._failure(f"answered HTTP {_status_text(status)}")
        if len(body) > self.MAX_BODY_BYTES:
            raise self._failure(f"answered more than {self.MAX_BODY_BYTES} bytes")
        try:
            return json.loads(body)["data"]
        except (ValueError, KeyError, TypeError):
            raise self._failure("answered HTTP 200 without an instant-query result") from None

    def query(self, promql: str) -> float | None:
        """The first series' value of `promql`; raises `MetricsUnavailable` on any failure."""
        data = self._data(promql)
        try:
            return _instant_value(data)
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._failure("answered HTTP 200 without an instant-query result") from None

    def query_by(self, promql: str, label: str) -> dict[str, float]:
        """Each series' value of `promql` by its `label`; raises `MetricsUnavailable`."""
        data = self._data(promql)
        try:
            if data["resultType"] != "vector":
                raise TypeError(data["resultType"])
            return {str(s["metric"][label]): float(s["value"][1]) for s in data["result"]}
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._failure("answered HTTP 200 without an instant vector") from None

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
    generative: bool = False
    """The model generates text (`spec.model.task`): judged per token (time to first
    token, inter-token latency, tokens), not on request latency and queue wait."""


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
        canary,
        stable,
        window,
        queue_wait_floor_ms=spec.batching.max_queue_delay_ms,
        generative=spec.model.generates,
    )


def requests_query(scope: TrackScope, window: str) -> str:
    """Requests the track answered in the window."""
    return f"sum(increase({REQUESTS_METRIC}{{{scope.selector()}}}{scope.range(window)}))"


def tokens_query(scope: TrackScope, window: str) -> str:
    """Tokens the track generated in the window."""
    return f"sum(increase({GENERATION_TOKENS_METRIC}{{{scope.selector()}}}{scope.range(window)}))"


def per_request_query(counter: str, scope: TrackScope, window: str) -> str:
    """The increase of `counter` per request the track answered in the window.

    `or vector(0)`: a counter without a series (none of its events yet) is 0, not no data.
    """
    every = f"{REQUESTS_METRIC}{{{scope.selector()}}}{scope.range(window)}"
    counted = f"{counter}{{{scope.selector()}}}{scope.range(window)}"
    return f"(sum(increase({counted})) or vector(0)) / sum(increase({every}))"


def tokens_per_replica_query(scope: TrackScope, window: str) -> str:
    """Tokens per second per replica: the rate over the window, by the track's series now.

    Every replica exports one token series from the moment its model loaded, so their
    count is the number of replicas.
    """
    series = f"{GENERATION_TOKENS_METRIC}{{{scope.selector()}}}"
    return f"sum(rate({series}{scope.range(window)})) / count({series})"


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


def generative_bounds(spec: AnalysisSpec, target: AnalysisTarget) -> list[PlannedCheck]:
    """A generative canary's own bounds, judged in both modes (unset ones left out).

    TTFT and ITL p99 in ms, preemptions per request, tokens per second per replica.
    """
    canary, window = target.canary, target.window
    bounded = [
        ("ttft-p99", p99_ms_query(TIME_TO_FIRST_TOKEN_METRIC, canary, window),
         None, spec.max_ttft_p99_ms),
        ("itl-p99", p99_ms_query(INTER_TOKEN_LATENCY_METRIC, canary, window),
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
            "error-rate",
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
            planned.append(PlannedCheck("p99-latency", latency, max=spec.max_p99_latency_ms))
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
    if target.generative:
        planned += generative_bounds(spec, target)
    planned += _custom_checks(spec, target)
    return planned


def _custom_checks(spec: AnalysisSpec, target: AnalysisTarget) -> list[PlannedCheck]:
    """`spec.checks`, their placeholders filled in for the canary."""
    return [
        PlannedCheck(c.name, _custom_query(c.query, target.canary, target.window),
                     min=c.min, max=c.max)
        for c in spec.checks
    ]  # fmt: skip


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
    if check.e_value is not None and check.threshold is not None:
        relation = ">=" if check.outcome is CheckOutcome.REJECTED else "<"
        unit = ITL.unit if check.name == ITL_TEST else "requests"
        return (
            f"{check.name} e-value {check.e_value:.4g} {relation} {check.threshold:.4g} "
            f"after {check.samples or 0:.0f} canary {unit}"
        )
    if check.value is None:
        return f"{check.name}: {check.outcome.value}"
    bounds = [f">= {check.min:.4g}" if check.min is not None else ""]
    bounds.append(f"<= {check.max:.4g}" if check.max is not None else "")
    return f"{check.name} {check.value:.4g} (wanted {' and '.join(b for b in bounds if b)})"


def _verdict(
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


def _inconclusive(
    reason: InconclusiveReason,
    message: str,
    requests: float | None = None,
    tokens: float | None = None,
) -> AnalysisResult:
    return AnalysisResult(
        verdict=Verdict.INCONCLUSIVE,
        reason=reason,
        message=message,
        requests=requests,
        tokens=tokens,
    )


def _too_few(
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
        return _inconclusive(InconclusiveReason.TOO_FEW_REQUESTS, message, requests, tokens)
    if target.generative and (tokens is None or tokens < spec.min_tokens):
        message = f"{tokens or 0:.0f} canary tokens in {span}, fewer than {spec.min_tokens}"
        return _inconclusive(InconclusiveReason.TOO_FEW_TOKENS, message, requests, tokens)
    return None


def evaluate(source: MetricSource, spec: AnalysisSpec, target: AnalysisTarget) -> AnalysisResult:
    """Judge the canary over `target.window`: Passed, Failed, or Inconclusive with a reason."""
    if not source.is_online():
        return _inconclusive(InconclusiveReason.PROMETHEUS_DOWN, "Prometheus did not answer")
    try:
        requests = _value(source, requests_query(target.canary, target.window))
        tokens = None
        if target.generative:
            tokens = _value(source, tokens_query(target.canary, target.window))
    except MetricsUnavailable as exc:
        return _inconclusive(InconclusiveReason.QUERY_ERROR, str(exc))
    too_few = _too_few(spec, target, requests, tokens, target.window)
    if too_few is not None:
        return too_few
    checks = [_judge(source, planned) for planned in plan_checks(spec, target)]
    return _verdict(checks, requests, tokens)


def read_stable_error_ratio(source: MetricSource, scope: TrackScope, window: str) -> float | None:
    """The stable track's 5xx ratio over `window` for the fallback trigger; None: no data.

    An unreachable Prometheus is no data too: failover on errors needs evidence (failover
    on missing replicas does not need Prometheus at all).
    """
    try:
        return _value(source, code_ratio_query(scope, window, SERVER_ERRORS))
    except MetricsUnavailable:
        return None


ERROR_TEST = "error-rate-vs-stable"
LATENCY_TEST = "latency-vs-stable"
TTFT_TEST = "ttft-vs-stable"
ITL_TEST = "itl-vs-stable"


@dataclass(frozen=True, slots=True)
class HistogramTest:
    """A sequential latency test: one event series per `le` bound of a histogram."""

    name: str
    metric: str
    bounds: tuple[float, ...]
    field: str
    """The `TrackCounts` field holding its cumulative bucket counts."""
    unit: str
    """What one count of the histogram is, for messages."""
    per_request: bool = False
    """Many counts per request (a stream's token gaps): its evidence is weighed per request.

    The gaps of one stream, and of streams batched into the same engine steps, are not
    independent (a slow step delays them all), while the test takes its counts as
    independent. So an increment's log-likelihood ratios are scaled by requests / counts
    (at most 1): a stream of 16 tokens weighs as one answer. Scaling by a factor ≤ 1
    fixed before the events are seen keeps the test valid (Jensen: E[exp(c·ℓ)] ≤
    E[exp(ℓ)]^c ≤ 1), and a real regression shows in every stream anyway."""


LATENCY = HistogramTest(
    LATENCY_TEST, REQUEST_DURATION_METRIC, LATENCY_BOUNDS_S, "latency_buckets", "requests"
)
TTFT = HistogramTest(
    TTFT_TEST, TIME_TO_FIRST_TOKEN_METRIC, LATENCY_BOUNDS_S, "ttft_buckets", "requests"
)
ITL = HistogramTest(
    ITL_TEST,
    INTER_TOKEN_LATENCY_METRIC,
    INTER_TOKEN_BOUNDS_S,
    "itl_buckets",
    "token gaps",
    per_request=True,
)


def histogram_tests(generative: bool) -> tuple[HistogramTest, ...]:
    """The latency tests of a model: request latency, or TTFT and ITL when it generates.

    A stream's duration is its length, not its speed, so a generative model is judged per
    token instead.
    """
    return (TTFT, ITL) if generative else (LATENCY,)


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


def codes_query(scope: TrackScope) -> str:
    """The track's cumulative requests by status code."""
    return f"sum by (code) ({REQUESTS_METRIC}{{{scope.selector()}}})"


def buckets_query(scope: TrackScope, test: HistogramTest) -> str:
    """The track's cumulative counts of the test's histogram by `le`."""
    return f"sum by (le) ({test.metric}_bucket{{{scope.selector()}}})"


def generated_query(scope: TrackScope) -> str:
    """The track's cumulative generated tokens."""
    return f"sum({GENERATION_TOKENS_METRIC}{{{scope.selector()}}})"


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
    tokens = (_value(source, generated_query(scope)) or 0.0) if generative else 0.0
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
    increments: dict[str, Increment | None] = {}
    if compared > 0:
        increments[ERROR_TEST] = Increment(
            canary_requests=served,
            stable_requests=compared,
            canary_events=(canary.errors - before_canary.errors,),
            stable_events=(stable.errors - before_stable.errors,),
        )
        for test in histogram_tests(generative):
            increments[test.name] = _latency_increment(
                test, (before_canary, canary), (before_stable, stable), served + compared
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
    too_few = _too_few(spec, target, samples, tokens, "this step")
    if too_few is not None:
        return too_few
    bounds = generative_bounds(spec, target) if target.generative else []
    own = [_judge(source, planned) for planned in [*bounds, *_custom_checks(spec, target)]]
    return _verdict([*_evidence_checks(evidence), *own], samples, tokens)


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
            return evidence, _inconclusive(
                InconclusiveReason.PROMETHEUS_DOWN, "Prometheus did not answer"
            )
        return evidence, _inconclusive(InconclusiveReason.QUERY_ERROR, str(exc))
    if canary is not None and stable is not None:
        evidence = accumulate(spec, evidence, canary, stable, generative=generative)
    samples = evidence.step_samples if evidence is not None else None
    if evidence is not None and evidence.rejected:
        tokens = evidence.step_tokens if generative else None
        return evidence, _verdict(_evidence_checks(evidence), samples or 0.0, tokens)
    if not due:
        return evidence, None
    read = {Track.CANARY: canary, Track.STABLE: stable}
    unseen = [track.value for track, counts in read.items() if counts is None]
    if unseen:
        message = f"no series of the {' and '.join(unseen)} track at the interval's end"
        return evidence, _inconclusive(InconclusiveReason.NO_DATA, message, samples)
    return evidence, _judged_at_interval_end(source, spec, target, evidence)
