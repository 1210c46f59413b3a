"""Every Prometheus metric of the runtime, named `fleetserve_*`, labelled model/version/track.

Counters and histograms are updated on the request path; gauges that mirror state (queue
depth, in-flight, memory, buffer pool) are read at scrape time by `StateCollector`, so the hot
path never pays for them. Each `Runtime` owns its own `CollectorRegistry`.

Every series a canary analysis reads (`fleetserve_requests_total` for each status code the
runtime answers, the request-duration and queue-wait histograms) exists at 0 for each loaded
version before its first request: `declare_version`, run for every loaded version by the
first collector of each scrape. Prometheus's `increase()` counts nothing before a series'
first sample, so a `code="500"` series born at 1 on the first error would hide that error
from every check (the instrumentation rule for label values known in advance).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetserve_runtime.core.logs import dropped_records

__all__ = [
    "ANSWERED_CODES",
    "LATENCY_BUCKETS_S",
    "STREAM_LIMITS",
    "SHADOW_ERROR_REASONS",
    "RuntimeMetrics",
    "ShadowMetrics",
    "SemanticCacheOutcome",
    "StateSnapshot",
    "StreamLimit",
    "TenantMetrics",
    "VersionFamilies",
]

LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512)
RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
LABELS = ("model", "version", "track")
ANSWERED_CODES = (200, 400, 401, 403, 404, 408, 413, 415, 429, 500, 503, 504)
"""Every HTTP status the runtime answers with (`server.http_errors.STATUS_OF` and success),
declared at 0."""
ALLOCATED_DOC = "Bytes allocated: the CUDA allocator's figure, or weights + leased buffers on CPU."
RESERVED_DOC = "Bytes reserved: the CUDA caching allocator's, or allocated + pooled buffers on CPU."
StreamLimit = Literal["max_streams", "send_timeout", "buffer"]
STREAM_LIMITS: tuple[StreamLimit, ...] = ("max_streams", "send_timeout", "buffer")
"""The limits `fleetserve_generation_stream_limits_total` counts, declared at 0."""
SemanticCacheOutcome = Literal["exact_hit", "semantic_hit", "miss", "bypass"]
"""What `fleetserve_semantic_cache_requests_total` counts: an exact repeat answered from the
cache, a similar prompt answered from it, a cacheable request generated, and a request the
cache may not answer (sampled), generated without a lookup."""
STALLED_DOC = "1 while the running batch is past its stuck limit and liveness fails, else 0."

# `_created` series double the scrape size and no query of ours reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream


@dataclass(frozen=True, slots=True)
class VersionFamilies:
    """Declares metric families labelled model/version/track (`LABELS`) in one registry."""

    registry: CollectorRegistry

    def counter(self, name: str, doc: str) -> Counter:
        """A counter family."""
        return Counter(name, doc, LABELS, registry=self.registry)

    def gauge(self, name: str, doc: str) -> Gauge:
        """A gauge family."""
        return Gauge(name, doc, LABELS, registry=self.registry)

    def histogram(
        self, name: str, doc: str, buckets: Sequence[float] = LATENCY_BUCKETS_S
    ) -> Histogram:
        """A histogram family; its buckets are the latency ones (seconds) unless given."""
        return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry)


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """State read at scrape time; `models` maps version → measured memory figures."""

    queue_depth: int
    inflight_requests: int
    memory_allocated_bytes: int
    memory_reserved_bytes: int
    pool_hits: int
    pool_misses: int
    models: dict[str, dict[str, float]]
    executor_stalled: bool = False
    """The running batch is past its stuck limit (liveness fails for it)."""


class StateCollector(Collector):
    """Yields gauges from a snapshot callback at scrape time."""

    def __init__(self, snapshot: Callable[[], StateSnapshot], model: str, track: str) -> None:
        self._snapshot = snapshot
        self._model = model
        self._track = track

    def describe(self) -> list[Metric]:
        """Nothing to describe up front: reading state at registration would be too early."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Build the state gauges from one snapshot."""
        snap = self._snapshot()
        base = [self._model, self._track]
        names = ["model", "track"]
        gauges = (
            (
                "fleetserve_queue_depth_requests",
                "Instances waiting in the queue.",
                snap.queue_depth,
            ),
            (
                "fleetserve_inflight_requests",
                "Requests accepted, not answered.",
                snap.inflight_requests,
            ),
            ("fleetserve_memory_allocated_bytes", ALLOCATED_DOC, snap.memory_allocated_bytes),
            ("fleetserve_memory_reserved_bytes", RESERVED_DOC, snap.memory_reserved_bytes),
            ("fleetserve_executor_stalled", STALLED_DOC, int(snap.executor_stalled)),
        )
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(base, value)
            yield family
        counters = (
            (
                "fleetserve_buffer_pool_hits",
                "Buffer requests served from the pool.",
                snap.pool_hits,
            ),
            ("fleetserve_buffer_pool_misses", "Buffer requests that allocated.", snap.pool_misses),
        )
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=names)
            counter.add_metric(base, value)
            yield counter
        yield from self._model_gauges(snap)

    def _model_gauges(self, snap: StateSnapshot) -> Iterator[Metric]:
        docs = {
            "weights_bytes": "Bytes of model weights.",
            "fixed_bytes": "Measured fixed activation overhead of a batch, in bytes.",
            "bytes_per_token": "Measured activation bytes per padded token.",
            "max_batch_tokens": "Padded tokens per batch the memory budget allows (0: no limit).",
            "load_seconds": "Seconds the version took to load and warm up.",
            "kv_cache_blocks": "KV-cache blocks of a generative version's pool, fixed at load.",
            "kv_cache_block_bytes": "Bytes of one KV-cache block (every layer's keys and values).",
        }
        for key, doc in docs.items():
            family = GaugeMetricFamily(f"fleetserve_model_{key}", doc, labels=list(LABELS))
            for version, figures in snap.models.items():
                if key in figures:
                    family.add_metric([self._model, version, self._track], figures[key])
            yield family


class LoadedVersionsCollector(Collector):
    """Declares the analysed series of every loaded version; yields no metric itself.

    Registered before the counters and histograms, so the scrape that first lists a
    version already carries its series, at 0.
    """

    def __init__(self, metrics: RuntimeMetrics, snapshot: Callable[[], StateSnapshot]) -> None:
        self._metrics = metrics
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        """Nothing to describe: this collector only creates the other collectors' series."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Declare each loaded version's series (idempotent), then yield nothing."""
        for version in self._snapshot().models:
            self._metrics.declare_version(version)
        return iter(())


class LogDropsCollector(Collector):
    """The log records dropped because the log queue was full (`logs`), read at scrape time."""

    def describe(self) -> list[Metric]:
        """Nothing to describe up front, like the other scrape-time collectors."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The process-wide count, one unlabelled counter."""
        yield CounterMetricFamily(
            "fleetserve_log_records_dropped",
            "Log records dropped because the log queue was full (stderr stalled).",
            value=dropped_records(),
        )


@dataclass(frozen=True, slots=True)
class _BatchSeries:
    """One version's labelled batch series, looked up once (`labels()` takes a lock)."""

    batch_size: Histogram
    real_tokens: Counter
    padded_tokens: Counter
    padding_efficiency: Histogram
    compute_seconds: Histogram
    queue_wait_seconds: Histogram


class RuntimeMetrics:
    """The runtime's metric objects and the few methods the request path calls.

    The request path reuses labelled series from small caches: `labels()` validates the
    values and takes the metric's lock on every call, a visible share of a request at a
    few thousand per second. The label values are bounded (loaded versions, answered codes).
    """

    def __init__(self, *, model: str, track: str, snapshot: Callable[[], StateSnapshot]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = model
        self._track = track
        self._declared: set[str] = set()
        self._request_series: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self._batch_series: dict[str, _BatchSeries] = {}
        reg = self.registry
        reg.register(LoadedVersionsCollector(self, snapshot))
        families = VersionFamilies(reg)
        self.requests = Counter(
            "fleetserve_requests", "Requests answered, by status code.",
            [*LABELS, "code"], registry=reg,
        )  # fmt: skip
        self.request_seconds = families.histogram(
            "fleetserve_request_duration_seconds", "Time from arrival to answer."
        )
        self.queue_wait_seconds = families.histogram(
            "fleetserve_queue_wait_seconds", "Time an instance waited before its batch formed."
        )
        self.compute_seconds = families.histogram(
            "fleetserve_batch_compute_seconds", "Forward + postprocess time of one batch."
        )
        self.batch_size = families.histogram(
            "fleetserve_batch_size", "Instances per batch.", BATCH_SIZE_BUCKETS
        )
        self.padding_efficiency = families.histogram(
            "fleetserve_padding_efficiency_ratio",
            "Real tokens / padded tokens, per batch.",
            RATIO_BUCKETS,
        )
        self.real_tokens = families.counter(
            "fleetserve_batch_tokens_real", "Real (unpadded) tokens computed."
        )
        self.padded_tokens = families.counter(
            "fleetserve_batch_tokens_padded", "Tokens of the padded batch rectangles."
        )
        self.cache_hits = families.counter("fleetserve_cache_hits", "Result cache hits.")
        self.cache_misses = families.counter("fleetserve_cache_misses", "Result cache misses.")
        self.oom_splits = families.counter(
            "fleetserve_oom_splits", "Batches split in half after running out of memory."
        )
        self.batch_failures = families.counter(
            "fleetserve_batch_failures", "Batches whose forward pass raised."
        )
        self.stream_limits = Counter(
            "fleetserve_generation_stream_limits",
            "Streamed generations refused or cut by a streaming limit: max_streams (refused "
            "with 503), send_timeout (the client took no bytes), buffer (it fell too far behind).",
            ["model", "track", "limit"], registry=reg,
        )  # fmt: skip
        for limit in STREAM_LIMITS:
            self.stream_limits.labels(model, track, limit)
        self.semantic_cache = Counter(
            "fleetserve_semantic_cache_requests",
            "OpenAI generation requests seen by the semantic cache, by outcome: exact_hit, "
            "semantic_hit, miss (greedy, generated), bypass (sampled, never cached).",
            [*LABELS, "outcome"], registry=reg,
        )  # fmt: skip
        reg.register(StateCollector(snapshot, model, track))
        reg.register(LogDropsCollector())
        self.tenants = TenantMetrics(reg, model=model, track=track)

    def labels(self, version: str) -> tuple[str, str, str]:
        """The (model, version, track) label values for `version`."""
        return (self._model, version, self._track)

    def declare_version(self, version: str) -> None:
        """Create `version`'s analysed series at 0; existing ones keep their counts.

        The series: a request count per answered status code, and the request-duration
        and queue-wait histograms.
        """
        if version in self._declared:
            return
        labels = self.labels(version)
        for code in ANSWERED_CODES:
            self.requests.labels(*labels, str(code))
        self.request_seconds.labels(*labels)
        self.queue_wait_seconds.labels(*labels)
        self._declared.add(version)

    def observe_request(self, version: str, code: int, seconds: float) -> None:
        """Count one answered request and its latency."""
        series = self._request_series.get((version, code))
        if series is None:
            labels = self.labels(version)
            series = (
                self.requests.labels(*labels, str(code)),
                self.request_seconds.labels(*labels),
            )
            self._request_series[(version, code)] = series
        count, latency = series
        count.inc()
        latency.observe(seconds)

    def observe_stream_limit(self, limit: StreamLimit) -> None:
        """Count one stream refused or cut by `limit`."""
        self.stream_limits.labels(self._model, self._track, limit).inc()

    def observe_semantic_cache(self, version: str, outcome: SemanticCacheOutcome) -> None:
        """Count one generation request's semantic-cache outcome."""
        self.semantic_cache.labels(*self.labels(version), outcome).inc()

    def _batch(self, version: str) -> _BatchSeries:
        series = self._batch_series.get(version)
        if series is None:
            labels = self.labels(version)
            series = self._batch_series[version] = _BatchSeries(
                batch_size=self.batch_size.labels(*labels),
                real_tokens=self.real_tokens.labels(*labels),
                padded_tokens=self.padded_tokens.labels(*labels),
                padding_efficiency=self.padding_efficiency.labels(*labels),
                compute_seconds=self.compute_seconds.labels(*labels),
                queue_wait_seconds=self.queue_wait_seconds.labels(*labels),
            )
        return series

    def observe_batch(
        self,
        version: str,
        *,
        size: int,
        real_tokens: int,
        padded_tokens: int,
        queue_waits: list[float],
        compute_s: float,
    ) -> None:
        """Record one completed batch."""
        series = self._batch(version)
        series.batch_size.observe(size)
        series.real_tokens.inc(real_tokens)
        series.padded_tokens.inc(padded_tokens)
        series.padding_efficiency.observe(real_tokens / max(padded_tokens, 1))
        series.compute_seconds.observe(compute_s)
        wait = series.queue_wait_seconds
        for seconds in queue_waits:
            wait.observe(seconds)


# -- tenants -------------------------------------------------------------------------------


class TenantMetrics:
    """Per-tenant series, labelled model/track/tenant (`tenants.md`).

    The tenant label takes only names from the tenants table and the default tenant's
    label, so its cardinality is bounded by the table (at most 256 tenants) plus one.
    """

    def __init__(self, registry: CollectorRegistry, *, model: str, track: str) -> None:
        self._labels = (model, track)
        names = ["model", "track", "tenant"]
        self.requests = Counter(
            "fleetserve_tenant_requests", "Requests admitted past the tenant's quota, by tenant.",
            names, registry=registry,
        )  # fmt: skip
        self.rejections = Counter(
            "fleetserve_tenant_rejections",
            "Requests refused with 429 because their tenant was at its quota (max_requests).",
            names, registry=registry,
        )  # fmt: skip
        self.queue_wait_seconds = Histogram(
            "fleetserve_tenant_queue_wait_seconds",
            "Time a tenant's request waited in an engine's queue before it ran.",
            names, buckets=LATENCY_BUCKETS_S, registry=registry,
        )  # fmt: skip

    def declare(self, tenant: str) -> None:
        """Create `tenant`'s series at 0, so a rate over them counts its first request."""
        self.requests.labels(*self._labels, tenant)
        self.rejections.labels(*self._labels, tenant)
        self.queue_wait_seconds.labels(*self._labels, tenant)

    def observe_request(self, tenant: str) -> None:
        """Count one request of `tenant` admitted past its quota."""
        self.requests.labels(*self._labels, tenant).inc()

    def observe_rejection(self, tenant: str) -> None:
        """Count one 429 of `tenant`."""
        self.rejections.labels(*self._labels, tenant).inc()

    def observe_queue_wait(self, tenant: str, seconds: float) -> None:
        """Record how long one request (or instance) of `tenant` waited in a queue."""
        self.queue_wait_seconds.labels(*self._labels, tenant).observe(seconds)


# Shadow mirroring (`server.shadow`): what the serving pod copied to the next version, and
# how far the two answers agreed. Labelled like every series, plus the shadow's version.
SHADOW_LABELS = (*LABELS, "shadow_version")
ShadowErrorReason = Literal["5xx", "4xx", "timeout", "transport"]
SHADOW_ERROR_REASONS: tuple[ShadowErrorReason, ...] = ("5xx", "4xx", "timeout", "transport")
"""Why a copy counts as a shadow error: its status, no answer in time, no connection."""
AGREEMENT_BUCKETS = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)
"""Similarity and overlap bounds, finest near 1 where two versions of one model land."""


@dataclass(frozen=True, slots=True)
class ShadowSeries:
    """One (version, shadow version)'s series, looked up once."""

    mirrored: Counter
    dropped: Counter
    errors: dict[ShadowErrorReason, Counter]
    compared: Counter
    agreed: Counter
    agreement: Histogram
    seconds: Histogram


class ShadowMetrics:
    """The shadow mirror's families, in the runtime's registry; series declared at 0 on use."""

    def __init__(self, registry: CollectorRegistry, *, model: str, track: str) -> None:
        self._model = model
        self._track = track
        self._series: dict[tuple[str, str], ShadowSeries] = {}

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*SHADOW_LABELS, *extra], registry=registry)

        self.mirrored = counter(
            "fleetserve_shadow_mirrored", "Copies the shadow answered or failed, counted when done."
        )
        self.dropped = counter(
            "fleetserve_shadow_dropped", "Sampled copies dropped: shadow.max_concurrency in flight."
        )
        self.errors = counter(
            "fleetserve_shadow_errors",
            "Copies the shadow did not answer with 2xx in time, by reason.",
            ("reason",),
        )
        self.compared = counter(
            "fleetserve_shadow_compared", "Answer units compared (vectors, generated answers)."
        )
        self.agreed = counter(
            "fleetserve_shadow_agreed",
            "Compared units that agreed (cosine >= shadow.min_cosine; generated text equal).",
        )
        self.agreement = Histogram(
            "fleetserve_shadow_agreement_ratio",
            "Cosine similarity (vectors) or prefix overlap (generated text) per compared unit.",
            SHADOW_LABELS, buckets=AGREEMENT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.seconds = Histogram(
            "fleetserve_shadow_duration_seconds", "Time the shadow took to answer a copy.",
            SHADOW_LABELS, buckets=LATENCY_BUCKETS_S, registry=registry,
        )  # fmt: skip

    def series(self, version: str, shadow_version: str) -> ShadowSeries:
        """The series of copies of `version`'s requests to `shadow_version`, made at 0."""
        key = (version, shadow_version)
        found = self._series.get(key)
        if found is None:
            labels = (self._model, version, self._track, shadow_version)
            found = self._series[key] = ShadowSeries(
                mirrored=self.mirrored.labels(*labels),
                dropped=self.dropped.labels(*labels),
                errors={
                    reason: self.errors.labels(*labels, reason) for reason in SHADOW_ERROR_REASONS
                },
                compared=self.compared.labels(*labels),
                agreed=self.agreed.labels(*labels),
                agreement=self.agreement.labels(*labels),
                seconds=self.seconds.labels(*labels),
            )
        return found
