"""The PromQL the analysis sends: which series of a track, and what is asked of them.

Every runtime metric the analysis reads is named here, from the runtime's contract
(`contract`), and nowhere else in the package: the scope of a track (`TrackScope`), the pair a
rollout compares (`AnalysisTarget`, `target_for`), the query text of both modes, and the
runtime's latency histograms as the sequential tests read them (`HistogramTest`). Pure text:
nothing here sends a query.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fleetserve_operator.contract import (
    GENERATION_TOKENS_METRIC,
    INTER_TOKEN_BOUNDS_S,
    INTER_TOKEN_LATENCY_METRIC,
    LATENCY_BOUNDS_S,
    REQUEST_DURATION_METRIC,
    REQUESTS_METRIC,
    TIME_TO_FIRST_TOKEN_METRIC,
)
from fleetserve_operator.naming import Track
from fleetserve_operator.spec import InferenceServiceSpec, InferenceServiceStatus, parse_duration_s

__all__ = [
    "ERROR_RATE",
    "ERROR_TEST",
    "GAP_CHECKS",
    "GATED_ABOVE",
    "ITL",
    "ITL_P99",
    "ITL_TEST",
    "LATENCY",
    "LATENCY_TEST",
    "P99_LATENCY",
    "REJECTIONS",
    "SERVER_ERRORS",
    "TTFT",
    "TTFT_P99",
    "TTFT_TEST",
    "AnalysisTarget",
    "HistogramTest",
    "TrackScope",
    "buckets_query",
    "code_ratio_query",
    "codes_query",
    "custom_query",
    "generated_query",
    "histogram_tests",
    "memory_query",
    "p99_ms_query",
    "per_request_query",
    "promql_duration",
    "requests_query",
    "target_for",
    "tokens_per_replica_query",
    "tokens_query",
]


SERVER_ERRORS = "5.."
REJECTIONS = "503|504"  # the runtime's QueueFull (503) and DeadlineExceeded (504)


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
    at: str | None = None
    """Read the window as of this time (RFC 3339) instead of now, `offset` before it: the
    bake's stable baseline, the window the 100% step's last analysis read."""

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
        if self.offset:
            selected = f"{selected} offset {promql_duration(self.offset)}"
        if self.at is not None:
            selected = f"{selected} @ {datetime.fromisoformat(self.at).timestamp():.0f}"
        return selected


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
    gated: bool = False
    """Sequential mode: the step's pass gives the canary more than half of the traffic, or
    promotes it, so it needs the evidence of the power gates (`power`) as well."""
    canary_alone: bool = False
    """The canary carries all the traffic (the 100% step): sequential mode holds it to
    stable's baseline when stable answers nothing."""
    canary_served_copies: bool = False
    """A shadow stage came first (`rollout.shadow`): the canary's counters already hold
    the copies it answered, so sequential mode counts them from its first look, not from 0."""


GATED_ABOVE = 50
"""A step whose pass gives the canary more than this share (or promotes it) is gated."""


def target_for(
    spec: InferenceServiceSpec, status: InferenceServiceStatus, *, namespace: str
) -> AnalysisTarget:
    """The canary and stable series a rollout's analysis compares now.

    At 100% the stable track gets no traffic, so its baseline is read from the window
    before (`offset`), when it still served most requests. During the bake that window is
    pinned to the bake's start (`at`): the one the 100% step passed on.
    """
    window = (spec.rollout.analysis and spec.rollout.analysis.window) or spec.rollout.interval
    model = spec.model.name
    canary = TrackScope(namespace, model, status.canary_version or spec.model.version, Track.CANARY)
    alone = status.canary_weight == 100
    stable = TrackScope(
        namespace,
        model,
        status.stable_version or "",
        Track.STABLE,
        offset=window if alone else None,
        at=status.rollout.bake.since if status.rollout.bake is not None else None,
    )
    steps, index = spec.rollout.steps, status.rollout.step_index
    following = 100 if index is None or index + 1 >= len(steps) else steps[index + 1]
    return AnalysisTarget(
        canary,
        stable,
        window,
        queue_wait_floor_ms=spec.batching.max_queue_delay_ms,
        generative=spec.model.generates,
        gated=index is not None and following > GATED_ABOVE,
        canary_alone=alone,
        canary_served_copies=spec.rollout.shadow is not None,
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


def custom_query(template: str, scope: TrackScope, window: str) -> str:
    """A `spec.checks` query, its placeholders (`$namespace`, `$window`, ...) filled in."""
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


def memory_query(metric: str, *, namespace: str, model: str, version: str) -> str:
    """PromQL for one memory gauge of the stable track of `model` at `version`.

    `namespace` is the scrape target's namespace label (added by Kubernetes service
    discovery, a PodMonitor, or the e2e harness); the runtime adds model/version/track.
    """
    selector = f'namespace="{namespace}",model="{model}",version="{version}",track="{Track.STABLE}"'
    return f"max({metric}{{{selector}}})"


def codes_query(scope: TrackScope) -> str:
    """The track's cumulative requests by status code."""
    return f"sum by (code) ({REQUESTS_METRIC}{{{scope.selector()}}})"


def buckets_query(scope: TrackScope, test: HistogramTest) -> str:
    """The track's cumulative counts of the test's histogram by `le`."""
    return f"sum by (le) ({test.metric}_bucket{{{scope.selector()}}})"


def generated_query(scope: TrackScope) -> str:
    """The track's cumulative generated tokens."""
    return f"sum({GENERATION_TOKENS_METRIC}{{{scope.selector()}}})"


ERROR_TEST = "error-rate-vs-stable"
LATENCY_TEST = "latency-vs-stable"
TTFT_TEST = "ttft-vs-stable"
ITL_TEST = "itl-vs-stable"
ERROR_RATE = "error-rate"
P99_LATENCY = "p99-latency"
TTFT_P99 = "ttft-p99"
ITL_P99 = "itl-p99"
"""The absolute bounds' checks, by the name both modes give them."""
GAP_CHECKS = frozenset({ITL_TEST, ITL_P99})
"""The checks that count gaps between tokens, not requests."""


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
