"""Prometheus metrics of the generative engine, labelled model/version/track like the rest.

Latencies are per token as a client sees them: time to first token (arrival to the step that
produced it, queueing and prefill included) and the gap between consecutive tokens of a
stream. The engine's worker thread updates them once per step; gauges mirror its state after
the step (prometheus_client is thread-safe).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetserve_runtime.core.metrics import VersionFamilies

__all__ = ["GenerationMetrics", "VersionGenerationMetrics"]

INTER_TOKEN_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
"""Finer than the request buckets where one CPU step of a small model lands (10-200 ms)."""


@dataclass(frozen=True, slots=True)
class VersionGenerationMetrics:
    """The metric children of one version: what the engine's hot path touches."""

    time_to_first_token: Histogram
    inter_token_latency: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    kv_cache_usage: Gauge
    running: Gauge
    waiting: Gauge
    preemptions: Counter
    prefix_cache_hits: Counter
    prefix_cache_queries: Counter
    prefix_cache_resumed_hits: Counter
    prefix_cache_resumed_queries: Counter


class GenerationMetrics:
    """Registers the generative metric families in `registry`; one instance per registry."""

    def __init__(self, registry: CollectorRegistry, *, model: str, track: str) -> None:
        self._model = model
        self._track = track
        self._registry = registry
        families = VersionFamilies(registry)
        self.time_to_first_token = families.histogram(
            "fleetserve_time_to_first_token_seconds",
            "Time from a generation request's arrival to its first token.",
        )
        self.inter_token_latency = families.histogram(
            "fleetserve_inter_token_latency_seconds",
            "Time between consecutive tokens of one stream.",
            INTER_TOKEN_BUCKETS_S,
        )
        self.prompt_tokens = families.counter(
            "fleetserve_prompt_tokens", "Prompt tokens of admitted generation requests."
        )
        self.generation_tokens = families.counter(
            "fleetserve_generation_tokens", "Tokens generated."
        )
        self.kv_cache_usage = families.gauge(
            "fleetserve_kv_cache_usage_ratio",
            "Share of KV cache blocks held by sequences (cached free blocks count as free).",
        )
        self.running = families.gauge(
            "fleetserve_running_sequences", "Sequences in the running batch."
        )
        self.waiting = families.gauge(
            "fleetserve_waiting_sequences",
            "Sequences waiting for admission, preempted ones included.",
        )
        self.preemptions = families.counter(
            "fleetserve_preemptions",
            "Sequences preempted (blocks freed, recomputed later) when KV blocks ran out.",
        )
        self.prefix_cache_hits = families.counter(
            "fleetserve_prefix_cache_hits",
            "Prompt tokens whose KV blocks came from the prefix cache, at first admission.",
        )
        self.prefix_cache_queries = families.counter(
            "fleetserve_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache, at first admission.",
        )
        self.prefix_cache_resumed_hits = families.counter(
            "fleetserve_prefix_cache_resumed_hits",
            "Tokens of preempted sequences found again in the prefix cache on re-admission.",
        )
        self.prefix_cache_resumed_queries = families.counter(
            "fleetserve_prefix_cache_resumed_queries",
            "Tokens of preempted sequences looked up in the prefix cache on re-admission.",
        )

    @property
    def registry(self) -> CollectorRegistry:
        """The registry the families live in."""
        return self._registry

    def for_version(self, version: str) -> VersionGenerationMetrics:
        """The children labelled for `version` (creating them, so they export from zero)."""
        labels = (self._model, version, self._track)
        return VersionGenerationMetrics(
            time_to_first_token=self.time_to_first_token.labels(*labels),
            inter_token_latency=self.inter_token_latency.labels(*labels),
            prompt_tokens=self.prompt_tokens.labels(*labels),
            generation_tokens=self.generation_tokens.labels(*labels),
            kv_cache_usage=self.kv_cache_usage.labels(*labels),
            running=self.running.labels(*labels),
            waiting=self.waiting.labels(*labels),
            preemptions=self.preemptions.labels(*labels),
            prefix_cache_hits=self.prefix_cache_hits.labels(*labels),
            prefix_cache_queries=self.prefix_cache_queries.labels(*labels),
            prefix_cache_resumed_hits=self.prefix_cache_resumed_hits.labels(*labels),
            prefix_cache_resumed_queries=self.prefix_cache_resumed_queries.labels(*labels),
        )
