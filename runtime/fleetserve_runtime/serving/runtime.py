"""The `Runtime`: one served model name, wired from its parts; the API's `ServingFacade`.

`server.app` builds one per process and talks to it only through `facade.ServingFacade`. It owns the
engine-agnostic core (the `ModelRegistry`, result cache, buffer pool, metrics) and composes
the concerns that live in their own modules:

- `versions.VersionLoader`: resolve, load, calibrate, warm and activate a version;
- `encoder.engine.EncoderEngine`: the request path and the scheduling loop (queue, batches,
  executor, delivery, deadlines);
- `generate.engine.GenerationEngine`: one per loaded generative version (built here, started
  by the loader), serving `generate`; the encoder path refuses a generative version;
- here: lifecycle (start, the initial load, stop) and introspection for the API (snapshot
  for the scrape-time gauges, metadata figures, readiness and liveness).

Liveness (`core.liveness.judge`) watches the executor's batches (prepare and compute), the worker
thread of every generation engine still running (the active version's, and those of released
versions still draining their streams) and, through a heartbeat thread, the event loop.
Nothing here knows about HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetserve_runtime.core.cache import ResultCache
from fleetserve_runtime.core.config import RuntimeConfig
from fleetserve_runtime.core.errors import InvalidInput, ModelNotReady
from fleetserve_runtime.core.liveness import Liveness, LoopHeartbeat, Worker, judge, judge_workers
from fleetserve_runtime.core.memory import BufferPool
from fleetserve_runtime.core.metrics import RuntimeMetrics, StateSnapshot
from fleetserve_runtime.encoder.batcher import make_bucket_policy
from fleetserve_runtime.encoder.engine import (
    EncoderEngine,
    InferenceCall,
    InferenceResult,
    StageTimings,
)
from fleetserve_runtime.encoder.executor import (
    BatchOutcome,
    Executor,
    device_memory,
    resolve_device,
    set_threads,
)
from fleetserve_runtime.encoder.request_queue import RequestQueue
from fleetserve_runtime.generate.contracts import GenerationRequest
from fleetserve_runtime.generate.engine import GenerationEngine
from fleetserve_runtime.generate.limits import EngineLimits
from fleetserve_runtime.generate.metrics import GenerationMetrics
from fleetserve_runtime.generate.stream import GenerationStream
from fleetserve_runtime.models.registry import LoadedModel, ModelRegistry
from fleetserve_runtime.serving.versions import VersionLoader

__all__ = ["GenerationInfo", "InferenceCall", "InferenceResult", "Runtime", "StageTimings"]

log = logging.getLogger("fleetserve.runtime")


@dataclass(frozen=True, slots=True)
class GenerationInfo:
    """The active generative version's identity and limits, for the generation routes."""

    model: str
    version: str
    context_length: int


class Runtime:
    """One model name served by one replica; create inside a running event loop."""

    def __init__(
        self, config: RuntimeConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        if config.threads:
            set_threads(config.threads)
        self.device = resolve_device(config.device)
        batching = config.batching
        self.registry: ModelRegistry[GenerationEngine] = ModelRegistry(config.name)
        self.buckets = make_bucket_policy(batching.buckets, batching.max_sequence_length)
        self.cache = ResultCache(
            max_entries=config.cache.max_entries, max_bytes=config.cache.max_bytes
        )
        self.pool = BufferPool(
            max_bytes=config.memory.pool_max_bytes, pin=self.device.type == "cuda"
        )
        self.metrics = RuntimeMetrics(model=config.name, track=config.track, snapshot=self.snapshot)
        self.generation_metrics = GenerationMetrics(
            self.metrics.registry, model=config.name, track=config.track
        )
        self._clock = clock
        self._stopping = False
        self.engine = EncoderEngine(
            config,
            registry=self.registry,
            buckets=self.buckets,
            cache=self.cache,
            metrics=self.metrics,
            make_executor=self._make_executor,
            clock=clock,
        )
        self._executor = self.engine.executor
        self._versions = VersionLoader(
            config,
            registry=self.registry,
            executor=self._executor,
            buckets=self.buckets,
            make_engine=self._make_generation_engine,
        )
        self._heartbeat = LoopHeartbeat(
            asyncio.get_running_loop(), stall_s=config.health.loop_stall_s
        )
        self._loader: asyncio.Task[LoadedModel] | None = None
        self._generation_engines: weakref.WeakSet[GenerationEngine] = weakref.WeakSet()
        """Every engine built here, for liveness; weak, so a stopped one does not hold its model."""

    def _make_executor(self, on_done: Callable[[BatchOutcome], None]) -> Executor:
        memory = self.config.memory
        return Executor(
            device=self.device,
            pool=self.pool,
            budget_bytes=memory.budget_bytes,
            reserve_fraction=memory.reserve_fraction,
            on_done=on_done,
            log_sample=self.config.log_batch_sample,
        )

    def _make_generation_engine(self, loaded: LoadedModel) -> GenerationEngine:
        handler, kv = loaded.generative, loaded.kv
        if handler is None or kv is None:
            msg = f"version {loaded.version!r} is not a generative model"
            raise TypeError(msg)
        generation, queue = self.config.generation, self.config.queue
        limits = EngineLimits(
            block_size=kv.block_size,
            num_blocks=kv.num_blocks,
            max_running_sequences=generation.max_running_sequences,
            max_step_tokens=generation.max_step_tokens,
            max_queue_size=queue.max_queue_size,
            default_max_tokens=generation.default_max_tokens,
            default_timeout_s=generation.default_timeout_ms / 1000,
            max_timeout_s=generation.max_timeout_ms / 1000,
            priority_aging_s=queue.priority_aging_ms / 1000,
            retry_after_s=queue.retry_after_s,
            prefix_caching=generation.prefix_caching,
            policy=generation.policy,
        )
        engine = GenerationEngine(
            lm=handler.lm,
            codec=handler.codec,
            limits=limits,
            metrics=self.generation_metrics,
            context_length=handler.context_length,
            clock=self._clock,
            version=loaded.version,
        )
        self._generation_engines.add(engine)
        return engine

    @property
    def queue(self) -> RequestQueue[LoadedModel]:
        """The encoder engine's request queue."""
        return self.engine.queue

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start scheduling and load the configured model in the background."""
        self.engine.start()
        self._heartbeat.start()
        self._loader = asyncio.create_task(
            self.load_version(self.config.model, self.config.version), name="fleetserve-load"
        )
        self._loader.add_done_callback(self._log_load_failure)

    async def wait_ready(self) -> LoadedModel:
        """Wait for the initial model load; re-raises its error."""
        if self._loader is None:
            msg = "runtime not started"
            raise RuntimeError(msg)
        return await self._loader

    @property
    def is_ready(self) -> bool:
        """True once a model version is loaded and warmed and its engine runs."""
        if not self.registry.is_ready or not self.engine.is_running:
            return False
        engine = self.registry.active.engine
        return engine is None or engine.is_running

    def liveness(self) -> Liveness:
        """Whether the workers and the event loop still make progress (`core.liveness.judge`)."""
        now = time.perf_counter()
        return judge(
            now,
            workers=self._workers(),
            loop_lag_s=self._heartbeat.lag_s(now),
            health=self.config.health,
        )

    def _workers(self) -> list[Worker]:
        """The executor and the worker of every generation engine (idle once it has stopped)."""
        generation = [
            Worker(
                f"generation engine of version {engine.version!r}",
                engine.running_step(),
                unit="step",
                alive=not engine.worker_died,
            )
            for engine in list(self._generation_engines)
        ]
        return [Worker("executor", self._executor.running()), *generation]

    @property
    def load_failed(self) -> BaseException | None:
        """The initial load's error, if it failed."""
        if self._loader is None or not self._loader.done() or self._loader.cancelled():
            return None
        return self._loader.exception()

    async def stop(self) -> None:
        """Refuse new work, fail what is queued, let in-flight batches finish, stop threads.

        Generations still streaming end with an error event.
        """
        self._stopping = True
        self.engine.refuse_new()
        if self._loader is not None:
            self._loader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loader
        await self.engine.stop()
        await self._versions.stop()
        await asyncio.to_thread(self._heartbeat.stop)

    def _log_load_failure(self, task: asyncio.Task[LoadedModel]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("model load failed", exc_info=task.exception())

    # -- requests and model control ----------------------------------------------------

    async def infer(self, call: InferenceCall) -> InferenceResult:
        """Run one request's instances; raises the runtime's domain errors."""
        return await self.engine.infer(call)

    async def generate(self, request: GenerationRequest) -> GenerationStream:
        """Admit one generation on the requested (or active) version's engine.

        Raises before any event: `ModelNotFound` / `ModelNotReady` for the version,
        `InvalidInput` when it serves embeddings, and the engine's own refusals
        (`InputTooLong`, `QueueFull`, ...).
        """
        if self._stopping:
            msg = "server is shutting down"
            raise ModelNotReady(msg)
        loaded = self.registry.get(request.version)
        if loaded.engine is None:
            msg = (
                f"model {self.config.name!r} serves embeddings, not generation: use "
                f"/v2/models/{self.config.name}/infer"
            )
            raise InvalidInput(msg)
        return await loaded.engine.submit(request)

    @property
    def is_generative(self) -> bool:
        """True when the active version generates text."""
        return self.registry.is_ready and self.registry.active.generative is not None

    def generation_info(self) -> GenerationInfo:
        """The active generative version; `ModelNotReady` before a load, else `InvalidInput`."""
        active = self.registry.active
        handler = active.generative
        if handler is None:
            msg = f"model {self.config.name!r} serves embeddings, not generation"
            raise InvalidInput(msg)
        return GenerationInfo(self.config.name, active.version, handler.context_length)

    async def load_version(self, uri: str, version: str) -> LoadedModel:
        """Load and activate `version` (see `VersionLoader.load`)."""
        return await self._versions.load(uri, version)

    def release_previous(self) -> str | None:
        """Unload the previous version; returns its label (None if there was none).

        A generative version's engine stops once its streams have ended.
        """
        released = self.registry.release_previous()
        self._versions.retire()
        return released

    def model(self, version: str | None) -> LoadedModel:
        """The active version, or a loaded one by label."""
        return self.registry.get(version)

    def versions(self) -> list[str]:
        """Loaded version labels."""
        return self.registry.versions()

    @property
    def active_version(self) -> str | None:
        """The version new requests go to; None before the first load."""
        return self.registry.active.version if self.registry.is_ready else None

    # -- introspection -----------------------------------------------------------------

    def snapshot(self) -> StateSnapshot:
        """State for the scrape-time gauges."""
        stats = self.pool.stats
        models: dict[str, dict[str, float]] = {}
        weights = 0
        for version in self.registry.versions():
            loaded = self.registry.get(version)
            figures: dict[str, float] = {
                "max_batch_tokens": loaded.max_batch_tokens,
                "load_seconds": loaded.load_seconds,
            }
            if loaded.kv is not None:
                # The KV pool is held for good, like weights (CPU has no allocator to ask).
                weights += loaded.kv.pool_bytes
                figures.update(
                    kv_cache_blocks=loaded.kv.num_blocks,
                    kv_cache_block_bytes=loaded.kv.block_bytes,
                )
            if loaded.memory is not None:
                weights += loaded.memory.weights_bytes
                figures.update(
                    weights_bytes=loaded.memory.weights_bytes,
                    fixed_bytes=loaded.memory.fixed_bytes,
                    bytes_per_token=loaded.memory.bytes_per_token,
                )
            models[version] = figures
        measured = device_memory(self.device)
        if measured is not None:
            allocated, reserved = measured
        else:
            allocated = weights + stats.leased_bytes
            reserved = allocated + stats.pooled_bytes
        return StateSnapshot(
            queue_depth=len(self.queue),
            inflight_requests=self.engine.inflight_requests,
            memory_allocated_bytes=allocated,
            memory_reserved_bytes=reserved,
            pool_hits=stats.hits,
            pool_misses=stats.misses,
            models=models,
            executor_stalled=not judge_workers(
                time.perf_counter(), workers=self._workers(), health=self.config.health
            ).ok,
        )

    def _source(self, model: LoadedModel) -> dict[str, Any]:
        """Where a version's files came from, for the metadata endpoint.

        For the configured model: `model_source` (else `model`), `model_digest` and
        `model_metadata`; for one loaded from another URI through model control, that URI.
        """
        config = self.config
        if model.uri != config.model:
            return {"uri": model.uri, "digest": None, "metadata": {}}
        return {
            "uri": config.model_source or config.model,
            "digest": config.model_digest,
            "metadata": dict(config.model_metadata),
        }

    def describe(self, model: LoadedModel) -> dict[str, Any]:
        """Measured memory figures and limits for the model metadata endpoint."""
        profile = model.memory
        figures: dict[str, Any] = {
            "memory_budget_bytes": self.config.memory.budget_bytes,
            "weights_bytes": profile.weights_bytes if profile else None,
            "fixed_bytes": profile.fixed_bytes if profile else None,
            "bytes_per_token": profile.bytes_per_token if profile else None,
            "load_seconds": model.load_seconds,
            "precision": model.metadata.precision,
            # The guards' figures: how close to fp32 a reduced precision came, how fast.
            "min_cosine": model.metadata.min_cosine,
            "speedup": model.metadata.speedup,
            "source": self._source(model),
        }
        if model.generative is None or model.kv is None:
            return {
                "max_batch_tokens": model.max_batch_tokens,
                "max_batch_size": self.config.batching.max_batch_size,
                "bucket_edges": self.buckets.edges,
                **figures,
            }
        kv, generation = model.kv, self.config.generation
        stats = model.engine.stats() if model.engine is not None else None
        return {
            **figures,
            "context_length": model.generative.context_length,
            "max_running_sequences": generation.max_running_sequences,
            "max_step_tokens": generation.max_step_tokens,
            "prefix_caching": generation.prefix_caching,
            "policy": generation.policy,
            "kv_cache": {
                "num_blocks": kv.num_blocks,
                "block_size": kv.block_size,
                "block_bytes": kv.block_bytes,
                "pool_bytes": kv.pool_bytes,
                "token_capacity": kv.token_capacity,
                "step_activation_bytes": kv.activation_bytes,
                "free_blocks": stats.free_blocks if stats else None,
                "usage_ratio": stats.kv_usage_ratio if stats else None,
                "running_sequences": stats.running if stats else None,
                "waiting_sequences": stats.waiting if stats else None,
            },
        }
