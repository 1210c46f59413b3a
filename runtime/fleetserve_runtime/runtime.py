"""The `Runtime`: wires queue, batcher, executor, registry, cache and metrics together.

Data flows one way: `infer` preprocesses at the door, answers cache hits, queues the rest and
waits; the scheduler task forms batches whenever the executor can take one (and expires
overdue items even while it cannot, so a 504 is never late by a batch); the executor's
outcomes come back to the event loop in one hop per batch. Nothing here knows about HTTP.

A request's deadline holds until its batch starts computing: at the deadline, items still
queued, or formed into a batch that waits behind the running one, are withdrawn and answered
504 (never computed); only items whose batch is computing get `RESULT_GRACE_S` more. Liveness
(`liveness.judge`) watches the executor's batches (prepare and compute) and, through a
heartbeat thread, the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetserve_runtime.batcher import (
    Batch,
    BatchLimits,
    make_bucket_policy,
    plan_batch,
)
from fleetserve_runtime.cache import ResultCache, cache_key
from fleetserve_runtime.config import RuntimeConfig
from fleetserve_runtime.errors import (
    DeadlineExceeded,
    FleetserveError,
    InputTooLong,
    InvalidInput,
    ItemFailed,
    ModelNotReady,
)
from fleetserve_runtime.executor import (
    BatchJob,
    BatchOutcome,
    Executor,
    device_memory,
    resolve_device,
    set_threads,
)
from fleetserve_runtime.liveness import Liveness, LoopHeartbeat, judge, judge_executor
from fleetserve_runtime.logs import current_request
from fleetserve_runtime.memory import BufferPool, MemoryProfile
from fleetserve_runtime.metrics import RuntimeMetrics, StateSnapshot
from fleetserve_runtime.models.base import BatchLayout, ItemError, ItemResult
from fleetserve_runtime.models.registry import LoadedModel, ModelRegistry, resolve_handler
from fleetserve_runtime.request_queue import PendingItem, Priority, RequestQueue

__all__ = ["InferenceCall", "InferenceResult", "Runtime", "StageTimings"]

log = logging.getLogger("fleetserve.runtime")

CALIBRATION_TOKENS = 1024
"""Largest padded-token count of one warmup batch; bounds warmup time on a CPU."""

MAX_CHARS_PER_TOKEN = 64
"""A text longer than this many characters per allowed token cannot fit, whatever the
tokenizer: such inputs are refused (or cut, when truncation was asked) before tokenising,
which runs on the event loop and would stall every other request for a huge input."""

RESULT_GRACE_S = 30.0
"""How long past its deadline a request whose batch is computing may wait for the batch's
result before it is answered 504; only a hung model ever hits it."""


@dataclass(frozen=True, slots=True)
class InferenceCall:
    """One request as the API hands it over: instances plus scheduling parameters."""

    instances: Sequence[object]
    version: str | None = None
    priority: Priority = Priority.NORMAL
    timeout_ms: int | None = None
    truncate: bool = False


@dataclass(slots=True)
class StageTimings:
    """Per-stage seconds of a request (the slowest item's, for multi-instance requests)."""

    queue_s: float = 0.0
    batch_s: float = 0.0
    compute_s: float = 0.0
    batch_size: int = 0
    """Instances in the (largest) batch the request's instances ran in."""

    def merge(self, other: StageTimings) -> None:
        """Keep the larger value of each stage."""
        self.queue_s = max(self.queue_s, other.queue_s)
        self.batch_s = max(self.batch_s, other.batch_s)
        self.compute_s = max(self.compute_s, other.compute_s)
        self.batch_size = max(self.batch_size, other.batch_size)


@dataclass(frozen=True, slots=True)
class InferenceResult:
    """Per-instance results of one request, and where the time went."""

    model: LoadedModel
    results: list[ItemResult]
    timings: StageTimings


@dataclass(slots=True, eq=False)
class _Ticket:
    future: asyncio.Future[tuple[ItemResult, StageTimings]]
    key: bytes | None
    timings: StageTimings = field(default_factory=StageTimings)
    job: BatchJob | None = None
    """The batch the item was formed into, and its index there; None while queued."""
    index: int = 0


def calibration_shapes(max_len: int) -> list[tuple[int, int]]:
    """(batch size, length) shapes whose peak memory fits the per-token cost."""
    short = min(8, max_len)
    mid = min(64, max_len)
    return [(1, short), (max(1, CALIBRATION_TOKENS // (4 * mid)), mid), (2, max_len)]


def warmup_shapes(edges: Sequence[int], max_batch_size: int) -> list[tuple[int, int]]:
    """One batch per bucket edge, as large as the warmup token cap allows."""
    return [(max(1, min(max_batch_size, CALIBRATION_TOKENS // edge)), edge) for edge in edges]


class Runtime:
    """One model name served by one replica; create inside a running event loop."""

    def __init__(
        self, config: RuntimeConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._clock = clock
        if config.threads:
            set_threads(config.threads)
        self.device = resolve_device(config.device)
        batching = config.batching
        self.registry = ModelRegistry(config.name)
        self.buckets = make_bucket_policy(batching.buckets, batching.max_sequence_length)
        self.queue = RequestQueue(
            max_size=config.queue.max_queue_size, retry_after_s=config.queue.retry_after_s
        )
        self.cache = ResultCache(
            max_entries=config.cache.max_entries, max_bytes=config.cache.max_bytes
        )
        self.pool = BufferPool(
            max_bytes=config.memory.pool_max_bytes, pin=self.device.type == "cuda"
        )
        self.metrics = RuntimeMetrics(model=config.name, track=config.track, snapshot=self.snapshot)
        self._inflight_requests = 0
        self._wakeup = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._executor = Executor(
            device=self.device,
            pool=self.pool,
            budget_bytes=config.memory.budget_bytes,
            reserve_fraction=config.memory.reserve_fraction,
            on_done=self._on_batch_done,
            log_sample=config.log_batch_sample,
        )
        self._heartbeat = LoopHeartbeat(self._loop, stall_s=config.health.loop_stall_s)
        self._scheduler: asyncio.Task[None] | None = None
        self._loader: asyncio.Task[LoadedModel] | None = None
        self._load_lock = asyncio.Lock()
        self._stopping = False
        self._generation = 0

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start scheduling and load the configured model in the background."""
        self._scheduler = asyncio.create_task(self._schedule(), name="fleetserve-scheduler")
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
        """True once a model version is loaded and warmed and the scheduler runs."""
        return self.registry.is_ready and self._scheduler is not None and not self._stopping

    def liveness(self) -> Liveness:
        """Whether the executor and the event loop still make progress (`liveness.judge`)."""
        now = time.perf_counter()
        return judge(
            now,
            batch=self._executor.running(),
            loop_lag_s=self._heartbeat.lag_s(now),
            health=self.config.health,
        )

    @property
    def load_failed(self) -> BaseException | None:
        """The initial load's error, if it failed."""
        if self._loader is None or not self._loader.done() or self._loader.cancelled():
            return None
        return self._loader.exception()

    async def stop(self) -> None:
        """Refuse new work, fail what is queued, let in-flight batches finish, stop threads."""
        self._stopping = True
        for task in (self._scheduler, self._loader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        leftover = self.queue.pop_expired(float("inf"))
        for item in leftover:
            _fail(item, ModelNotReady("server is shutting down"))
        await asyncio.to_thread(self._executor.close)
        await asyncio.to_thread(self._heartbeat.stop)

    def _log_load_failure(self, task: asyncio.Task[LoadedModel]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("model load failed", exc_info=task.exception())

    # -- model versions ----------------------------------------------------------------

    async def load_version(self, uri: str, version: str) -> LoadedModel:
        """Resolve, load, calibrate and warm `version` off the event loop, then make it active.

        A version that is already loaded is activated at once (instant switch back). Loads
        run one at a time, so two loads of one label cannot both warm and activate.
        """
        async with self._load_lock:
            if version in self.registry.versions():
                loaded = self.registry.get(version)
                if uri != loaded.uri:
                    msg = (
                        f"version {version!r} is already loaded from {loaded.uri!r}; "
                        "unload it before loading another model under that label"
                    )
                    raise InvalidInput(msg)
                self.registry.activate(loaded)
                return loaded
            # Resolving imports and runs user code (module:factory, handler.py): like loading
            # and warming, it may take long and must not stall the event loop.
            loaded = await asyncio.to_thread(self._load_and_warm, uri, version)
            self._generation += 1
            loaded = replace(loaded, uri=uri, generation=self._generation)
            self.registry.activate(loaded)
        log.info(
            "model ready",
            extra={"version": version, "load_seconds": round(loaded.load_seconds, 3)},
        )
        return loaded

    def _load_and_warm(self, uri: str, version: str) -> LoadedModel:
        started = time.perf_counter()
        batching, memory = self.config.batching, self.config.memory
        handler = resolve_handler(
            uri,
            name=self.config.name,
            version=version,
            max_sequence_length=batching.max_sequence_length,
        )
        weights = self._executor.load(handler)
        samples = self._executor.run_shapes(
            handler,
            calibration_shapes(batching.max_sequence_length),
            packed=batching.packing,
            measure=True,
        )
        if not samples:
            msg = "the model runs out of memory even on a batch of one short request"
            raise ValueError(msg)
        profile = MemoryProfile.fit(weights, samples)
        max_tokens = batching.max_batch_tokens
        if not max_tokens and memory.budget_bytes:
            max_tokens = profile.max_batch_tokens(memory.budget_bytes, memory.reserve_fraction)
            if max_tokens < batching.max_sequence_length:
                msg = (
                    f"memory.budget_bytes {memory.budget_bytes} cannot hold one request of "
                    f"max_sequence_length {batching.max_sequence_length}: the model needs "
                    f"{weights} bytes of weights + {profile.fixed_bytes} fixed + "
                    f"{profile.bytes_per_token:.0f} per token"
                )
                raise ValueError(msg)
        if self.config.warmup:
            shapes = warmup_shapes(self.buckets.edges, batching.max_batch_size)
            self._executor.run_shapes(handler, shapes, packed=batching.packing, measure=False)
        return LoadedModel(handler, time.perf_counter() - started, profile, max_tokens)

    # -- requests ----------------------------------------------------------------------

    async def infer(self, call: InferenceCall) -> InferenceResult:
        """Run one request's instances; raises the runtime's domain errors."""
        if self._stopping:
            msg = "server is shutting down"
            raise ModelNotReady(msg)
        model = self.registry.get(call.version)
        now = self._clock()
        deadline = now + self._timeout_s(call.timeout_ms)
        results: list[ItemResult] = [None] * len(call.instances)
        tickets: list[tuple[int, _Ticket]] = []
        items: list[PendingItem] = []
        max_chars = self.config.batching.max_sequence_length * MAX_CHARS_PER_TOKEN
        context = current_request()
        request_id = context.request_id if context is not None else None
        for index, raw in enumerate(call.instances):
            instance = _bounded(raw, max_chars, truncate=call.truncate)
            prepared = model.handler.preprocess(instance, truncate=call.truncate)
            key = self._cache_key(model, instance, call.truncate)
            cached = self._cache_lookup(model, key)
            if cached is not None:
                results[index] = cached
                continue
            ticket = _Ticket(self._loop.create_future(), key)
            tickets.append((index, ticket))
            self.buckets.observe(prepared.length)
            items.append(
                PendingItem(
                    length=prepared.length,
                    priority=call.priority,
                    enqueued_at=now,
                    deadline=deadline,
                    group=model,
                    payload=prepared,
                    ticket=ticket,
                    bucket=self.buckets.bucket_of(prepared.length),
                    request_id=request_id,
                )
            )
        timings = StageTimings()
        if items:
            self.queue.push(items)
            self._wakeup.set()
            await self._await_items(items, tickets, results, timings)
        return InferenceResult(model, results, timings)

    async def _await_items(
        self,
        items: list[PendingItem],
        tickets: list[tuple[int, _Ticket]],
        results: list[ItemResult],
        timings: StageTimings,
    ) -> None:
        self._inflight_requests += 1
        deadline = max(item.deadline for item in items)
        futures = [ticket.future for _, ticket in tickets]
        try:
            pending = await _settle(futures, deadline - self._clock())
            if pending and _first_error(futures) is None:
                now = self._clock()
                for item in self._withdraw(items):
                    _expire(item, now)
                pending = await _settle(pending, RESULT_GRACE_S)
            if (error := _first_error(futures)) is not None:
                raise error
            if pending:
                msg = f"no result {RESULT_GRACE_S:.0f}s after the deadline; the model may be stuck"
                raise DeadlineExceeded(msg)
            for index, ticket in tickets:
                result, item_timings = ticket.future.result()
                results[index] = result
                timings.merge(item_timings)
        finally:
            self._inflight_requests -= 1
            # A caller that went away (or an error in a sibling item) must not leave work
            # behind that still costs compute, nor sibling errors nobody will ever read
            # (asyncio would log each as "exception was never retrieved").
            self._withdraw(items)
            for future in futures:
                if not future.done():
                    future.cancel()
                elif not future.cancelled():
                    future.exception()

    def _withdraw(self, items: list[PendingItem]) -> list[PendingItem]:
        """Take unanswered items that are not computing yet out of the queue or their batch."""
        withdrawn: list[PendingItem] = []
        for item in items:
            ticket: _Ticket = item.ticket
            if ticket.future.done():
                continue
            if item.live:
                self.queue.take(item)
            elif ticket.job is None or not self._executor.withdraw(ticket.job, ticket.index):
                continue
            withdrawn.append(item)
        return withdrawn

    def _timeout_s(self, timeout_ms: int | None) -> float:
        limits = self.config.queue
        if timeout_ms is None:
            return limits.default_timeout_ms / 1000
        if not 0 < timeout_ms <= limits.max_timeout_ms:
            msg = f"timeout_ms must be between 1 and {limits.max_timeout_ms}, got {timeout_ms}"
            raise InvalidInput(msg)
        return timeout_ms / 1000

    def _cache_key(self, model: LoadedModel, instance: object, truncate: bool) -> bytes | None:
        if not self.cache.enabled:
            return None
        return cache_key(
            model=self.config.name,
            version=f"{model.version}#{model.generation}",
            instance=instance,
            params={"truncate": truncate},
        )

    def _cache_lookup(self, model: LoadedModel, key: bytes | None) -> ItemResult | None:
        if key is None:
            return None
        labels = self.metrics.labels(model.version)
        cached = self.cache.get(key)
        (self.metrics.cache_misses if cached is None else self.metrics.cache_hits).labels(
            *labels
        ).inc()
        return cached

    # -- scheduling --------------------------------------------------------------------

    def _limits(self, model: LoadedModel | None) -> BatchLimits:
        batching, queue = self.config.batching, self.config.queue
        return BatchLimits(
            max_batch_size=batching.max_batch_size,
            max_queue_delay_s=batching.max_queue_delay_ms / 1000,
            max_batch_tokens=model.max_batch_tokens if model is not None else 0,
            aging_s=queue.priority_aging_ms / 1000,
            lower_class_share=queue.lower_class_share,
            min_padding_efficiency=batching.min_padding_efficiency,
        )

    async def _schedule(self) -> None:
        while True:
            self._wakeup.clear()
            now = self._clock()
            wake_at: float | None
            if self._executor.has_capacity:
                active = self.registry.active if self.registry.is_ready else None
                remaining = self._executor.remaining_s()
                not_before = None if remaining is None else now + remaining
                plan = plan_batch(self.queue, now, self._limits(active), not_before=not_before)
                for item in plan.expired:
                    _expire(item, now)
                if plan.batch is not None:
                    self._submit(plan.batch)
                    continue
                wake_at = plan.wake_at
            else:
                for item in self.queue.pop_expired(now):
                    _expire(item, now)
                wake_at = self.queue.next_deadline()
            timeout = None if wake_at is None else max(0.0, wake_at - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    def _submit(self, batch: Batch) -> None:
        model: LoadedModel = batch.group  # type: ignore[assignment]
        layout = BatchLayout(pad_to=batch.pad_to, packed=self.config.batching.packing)
        job = BatchJob(batch, model, layout)
        for index, item in enumerate(batch.items):
            ticket: _Ticket = item.ticket
            ticket.job, ticket.index = job, index
        self._executor.submit(job)

    def _on_batch_done(self, outcome: BatchOutcome) -> None:
        """Called on the executor's compute thread: hop to the event loop."""
        self._loop.call_soon_threadsafe(self._deliver, outcome)

    def _deliver(self, outcome: BatchOutcome) -> None:
        """Resolve the futures of a finished batch (on the event loop)."""
        job, batch = outcome.job, outcome.job.batch
        done = self._clock()
        compute_s = outcome.compute_s
        batch_s = max(0.0, done - compute_s - batch.formed_at)
        # Withdrawn items were answered when they were withdrawn, and never computed.
        computed = [
            (item, result)
            for n, (item, result) in enumerate(zip(batch.items, outcome.results, strict=True))
            if n not in outcome.withdrawn
        ]
        waits: list[float] = []
        for item, result in computed:
            ticket: _Ticket = item.ticket
            waits.append(batch.formed_at - item.enqueued_at)
            if ticket.future.done():
                continue
            timings = StageTimings(waits[-1], batch_s, compute_s, len(computed))
            if isinstance(result, FleetserveError):
                ticket.future.set_exception(result)
            elif isinstance(result, ItemError):
                ticket.future.set_exception(ItemFailed(result.message))
            else:
                ticket.future.set_result((result, timings))
                if ticket.key is not None:
                    self._cache_put(ticket.key, result)
        self._wakeup.set()
        if not computed:
            return
        version = job.model.version
        self.metrics.observe_batch(
            version,
            size=len(computed),
            real_tokens=sum(item.length for item, _ in computed),
            padded_tokens=len(computed) * max(item.length for item, _ in computed),
            queue_waits=waits,
            compute_s=compute_s,
        )
        if outcome.oom_splits:
            self.metrics.oom_splits.labels(*self.metrics.labels(version)).inc(outcome.oom_splits)
        if outcome.error_id is not None:
            self.metrics.batch_failures.labels(*self.metrics.labels(version)).inc()

    def _cache_put(self, key: bytes, result: ItemResult) -> None:
        try:
            self.cache.put(key, result)
        except (TypeError, ValueError):
            # A result the cache cannot size (not JSON-serialisable) is simply not cached;
            # it must never keep the batch's other requests from being answered.
            log.warning("result not cacheable", exc_info=True)

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
            inflight_requests=self._inflight_requests,
            memory_allocated_bytes=allocated,
            memory_reserved_bytes=reserved,
            pool_hits=stats.hits,
            pool_misses=stats.misses,
            models=models,
            executor_stalled=not judge_executor(
                time.perf_counter(), batch=self._executor.running(), health=self.config.health
            ).ok,
        )

    def describe(self, model: LoadedModel) -> dict[str, Any]:
        """Measured memory figures and limits for the model metadata endpoint."""
        profile = model.memory
        return {
            "max_batch_tokens": model.max_batch_tokens,
            "max_batch_size": self.config.batching.max_batch_size,
            "bucket_edges": self.buckets.edges,
            "memory_budget_bytes": self.config.memory.budget_bytes,
            "weights_bytes": profile.weights_bytes if profile else None,
            "fixed_bytes": profile.fixed_bytes if profile else None,
            "bytes_per_token": profile.bytes_per_token if profile else None,
            "load_seconds": model.load_seconds,
        }


def _bounded(instance: object, max_chars: int, *, truncate: bool) -> object:
    """Cut or refuse a text that cannot fit before the tokenizer spends time on it."""
    if not isinstance(instance, str) or len(instance) <= max_chars:
        return instance
    if truncate:
        return instance[:max_chars]
    msg = f"input of {len(instance)} characters cannot fit max_sequence_length in tokens"
    raise InputTooLong(msg)


def _fail(item: PendingItem, error: FleetserveError) -> None:
    ticket: _Ticket = item.ticket
    if not ticket.future.done():
        ticket.future.set_exception(error)


async def _settle(
    futures: Collection[asyncio.Future[Any]], timeout_s: float
) -> set[asyncio.Future[Any]]:
    """Wait until every future is done, one fails, or `timeout_s` passes; returns the pending."""
    _, pending = await asyncio.wait(
        futures, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_EXCEPTION
    )
    return pending


def _first_error(futures: Sequence[asyncio.Future[Any]]) -> BaseException | None:
    """The error of the first future (in request order) that failed, if any."""
    for future in futures:
        if future.done() and not future.cancelled() and (error := future.exception()):
            return error
    return None


def _expire(item: PendingItem, now: float) -> None:
    waited_ms = (now - item.enqueued_at) * 1000
    _fail(item, DeadlineExceeded(f"deadline passed after {waited_ms:.0f} ms in the queue"))
