"""The encoder engine: one forward pass per request, dynamic batches, results back to callers.

`Runtime` builds one and hands it requests through `infer`. Data flows one way: `infer`
preprocesses at the door, answers cache hits, queues the rest and waits; the scheduler task
forms batches (`batcher.plan_batch`) whenever the executor can take one (and expires overdue
items even while it cannot, so a 504 is never late by a batch); the executor's outcomes come
back to the event loop in one hop per batch. Nothing here knows about HTTP or about loading
models (`versions` does that); the engine reads the registry's active version only.

A request's deadline holds until its batch starts computing: at the deadline, items still
queued, or formed into a batch that waits behind the running one, are withdrawn and answered
504 (never computed); only items whose batch is computing get `RESULT_GRACE_S` more.

The engine sits on its own pure queue and batcher and on the engine-agnostic core
(`core.metrics`, `core.memory`, `core.cache`), so the generative engine sits beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field

from fleetserve_runtime.core.cache import ResultCache, cache_key
from fleetserve_runtime.core.config import RuntimeConfig
from fleetserve_runtime.core.errors import (
    DeadlineExceeded,
    FleetserveError,
    InputTooLong,
    ItemFailed,
    ModelNotReady,
)
from fleetserve_runtime.core.limits import MAX_CHARS_PER_TOKEN
from fleetserve_runtime.core.logs import current_request
from fleetserve_runtime.core.metrics import RuntimeMetrics
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.queueing import resolve_timeout
from fleetserve_runtime.core.tenants import CURRENT_TENANT
from fleetserve_runtime.encoder.batcher import Batch, BatchLimits, BucketPolicy, plan_batch
from fleetserve_runtime.encoder.executor import BatchJob, BatchOutcome, Executor
from fleetserve_runtime.encoder.request_queue import PendingItem, RequestQueue
from fleetserve_runtime.models.base import BatchLayout, ItemError, ItemResult
from fleetserve_runtime.models.registry import LoadedModel, ModelRegistry

__all__ = [
    "RESULT_GRACE_S",
    "EncoderEngine",
    "InferenceCall",
    "InferenceResult",
    "StageTimings",
]

log = logging.getLogger("fleetserve.runtime")

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
class _Request:
    """The queued items of one call, answered through one future.

    The future is done when every item has its result, or failed by the first item that
    fails. One future (and at most one timer) per request, however many instances it carries:
    a future and a waiting set per item cost a zero-cost request a fifth of its engine time.
    """

    future: asyncio.Future[None]
    results: list[ItemResult]
    timings: StageTimings
    pending: int = 0
    timer: asyncio.TimerHandle | None = None
    """The deadline, then the grace for items already computing; None once answered."""


@dataclass(slots=True, eq=False)
class _Ticket:
    """One item's place in its request."""

    request: _Request
    slot: int
    key: bytes | None
    job: BatchJob | None = None
    """The batch the item was formed into, and its index there; None while queued."""
    index: int = 0
    answered: bool = False

    def resolve(self, result: ItemResult, timings: StageTimings) -> None:
        if self.answered:
            return
        self.answered = True
        request = self.request
        request.results[self.slot] = result
        request.timings.merge(timings)
        request.pending -= 1
        if request.pending == 0 and not request.future.done():
            request.future.set_result(None)

    def fail(self, error: BaseException) -> None:
        if self.answered:
            return
        self.answered = True
        if not self.request.future.done():
            self.request.future.set_exception(error)


_Item = PendingItem[LoadedModel]


@dataclass(eq=False)
class EncoderEngine:
    """Queue, scheduler task and executor of one model name; create inside a running loop.

    `make_executor(on_done)` builds the executor that runs the batches; the engine passes
    its own outcome callback.
    """

    config: RuntimeConfig
    _: KW_ONLY
    registry: ModelRegistry
    buckets: BucketPolicy
    cache: ResultCache
    metrics: RuntimeMetrics
    make_executor: InitVar[Callable[[Callable[[BatchOutcome], None]], Executor]]
    clock: Callable[[], float] = time.monotonic
    queue: RequestQueue[LoadedModel] = field(init=False)
    executor: Executor = field(init=False)
    """Built here, from the caller's settings, because its outcomes must come back here."""
    _inflight_requests: int = field(default=0, init=False)
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop, init=False)
    _waiter: asyncio.Future[None] | None = field(default=None, init=False)
    """Resolved to wake the scheduler; None while it is planning."""
    _scheduler: asyncio.Task[None] | None = field(default=None, init=False)
    _stopping: bool = field(default=False, init=False)

    def __post_init__(
        self, make_executor: Callable[[Callable[[BatchOutcome], None]], Executor]
    ) -> None:
        self.queue = RequestQueue(
            max_size=self.config.queue.max_queue_size,
            retry_after_s=self.config.queue.retry_after_s,
            aging_s=self.config.queue.priority_aging_ms / 1000,
        )
        self.executor = make_executor(self._on_batch_done)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduler task."""
        self._scheduler = asyncio.create_task(self._schedule(), name="fleetserve-scheduler")

    @property
    def is_running(self) -> bool:
        """True while the scheduler runs and new requests are accepted."""
        return self._scheduler is not None and not self._stopping

    @property
    def inflight_requests(self) -> int:
        """Requests waiting for their items' results now."""
        return self._inflight_requests

    def refuse_new(self) -> None:
        """Answer new requests 503 from now on; `stop` does the rest."""
        self._stopping = True

    async def stop(self) -> None:
        """Refuse new work, fail what is queued, let in-flight batches finish, stop threads."""
        self._stopping = True
        if self._scheduler is not None:
            self._scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._scheduler
        for item in self.queue.pop_expired(float("inf")):
            _fail(item, ModelNotReady("server is shutting down"))
        await asyncio.to_thread(self.executor.close)

    # -- requests ----------------------------------------------------------------------

    async def infer(self, call: InferenceCall) -> InferenceResult:
        """Run one request's instances; raises the runtime's domain errors."""
        if self._stopping:
            msg = "server is shutting down"
            raise ModelNotReady(msg)
        model = self.registry.get(call.version)
        now = self.clock()
        deadline = now + self._timeout_s(call.timeout_ms)
        request = _Request(self._loop.create_future(), [None] * len(call.instances), StageTimings())
        items: list[_Item] = []
        max_chars = self.config.batching.max_sequence_length * MAX_CHARS_PER_TOKEN
        context = current_request()
        request_id = context.request_id if context is not None else None
        for index, raw in enumerate(call.instances):
            instance = _bounded(raw, max_chars, truncate=call.truncate)
            prepared = model.handler.preprocess(instance, truncate=call.truncate)
            key = self._cache_key(model, instance, call.truncate)
            cached = self._cache_lookup(model, key)
            if cached is not None:
                request.results[index] = cached
                continue
            ticket = _Ticket(request, index, key)
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
                    tenant=CURRENT_TENANT.get(),
                )
            )
        if items:
            request.pending = len(items)
            self.queue.push(items)
            self._wake()
            await self._await_items(request, items, deadline)
        return InferenceResult(model, request.results, request.timings)

    async def _await_items(self, request: _Request, items: list[_Item], deadline: float) -> None:
        self._inflight_requests += 1
        request.timer = self._loop.call_later(
            max(0.0, deadline - self.clock()), self._on_deadline, request, items
        )
        try:
            await request.future
        finally:
            self._inflight_requests -= 1
            if request.timer is not None:
                request.timer.cancel()
                request.timer = None
            # A caller that went away (or an error in a sibling item) must not leave work
            # behind that still costs compute.
            self._withdraw(items)

    def _on_deadline(self, request: _Request, items: list[_Item]) -> None:
        """At the deadline: withdraw what is not computing; the rest gets `RESULT_GRACE_S`."""
        now = self.clock()
        for item in self._withdraw(items):
            _expire(item, now)
        request.timer = (
            None
            if request.future.done()
            else self._loop.call_later(RESULT_GRACE_S, _give_up, request)
        )

    def _withdraw(self, items: list[_Item]) -> list[_Item]:
        """Take unanswered items that are not computing yet out of the queue or their batch."""
        withdrawn: list[_Item] = []
        for item in items:
            ticket: _Ticket = item.ticket
            if ticket.answered:
                continue
            if item.live:
                self.queue.take(item)
            elif ticket.job is None or not self.executor.withdraw(ticket.job, ticket.index):
                continue
            withdrawn.append(item)
        return withdrawn

    def _timeout_s(self, timeout_ms: int | None) -> float:
        limits = self.config.queue
        timeout_ms = resolve_timeout(
            timeout_ms,
            default=limits.default_timeout_ms,
            maximum=limits.max_timeout_ms,
            refusal="timeout_ms must be between 1 and {maximum}, got {requested}",
        )
        return timeout_ms / 1000

    def _cache_key(self, model: LoadedModel, instance: object, truncate: bool) -> bytes | None:
        if not self.cache.enabled:
            return None
        tenant = CURRENT_TENANT.get()
        return cache_key(
            model=self.config.name,
            version=f"{model.version}#{model.generation}",
            instance=instance,
            params={"truncate": truncate},
            tenant=None if tenant is None else tenant.name,
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

    def _wake(self) -> None:
        """Make the scheduler plan again (at most once however often it is called)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep(self, wake_at: float | None) -> None:
        """Sleep until `_wake` or `wake_at` (on the engine's clock), whichever comes first.

        A bare future and one timer handle: `asyncio.wait_for` on an `Event` would create a
        task per call, and the scheduler sleeps once per request under load.
        """
        waiter = self._waiter = self._loop.create_future()
        timer: asyncio.TimerHandle | None = None
        if wake_at is not None:
            timer = self._loop.call_later(max(0.0, wake_at - self.clock()), self._wake)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _schedule(self) -> None:
        while True:
            now = self.clock()
            wake_at: float | None
            if self.executor.has_capacity:
                active = self.registry.active if self.registry.is_ready else None
                remaining = self.executor.remaining_s()
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
            await self._sleep(wake_at)

    def _submit(self, batch: Batch[LoadedModel]) -> None:
        layout = BatchLayout(pad_to=batch.pad_to, packed=self.config.batching.packing)
        job = BatchJob(batch, batch.group, layout)
        for index, item in enumerate(batch.items):
            ticket: _Ticket = item.ticket
            ticket.job, ticket.index = job, index
        self.executor.submit(job)

    def _on_batch_done(self, outcome: BatchOutcome) -> None:
        """Called on the executor's compute thread: hop to the event loop."""
        self._loop.call_soon_threadsafe(self._deliver, outcome)

    def _deliver(self, outcome: BatchOutcome) -> None:
        """Resolve the futures of a finished batch (on the event loop)."""
        job, batch = outcome.job, outcome.job.batch
        done = self.clock()
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
            if item.tenant is not None:
                self.metrics.tenants.observe_queue_wait(item.tenant.name, waits[-1])
            if ticket.answered:
                continue
            if isinstance(result, FleetserveError):
                ticket.fail(result)
            elif isinstance(result, ItemError):
                ticket.fail(ItemFailed(result.message))
            else:
                ticket.resolve(result, StageTimings(waits[-1], batch_s, compute_s, len(computed)))
                if ticket.key is not None:
                    self._cache_put(ticket.key, result)
        self._wake()
        if not computed:
            return
        version = job.model.version
        metrics = self.metrics
        metrics.observe_batch(
            version,
            size=len(computed),
            real_tokens=sum(item.length for item, _ in computed),
            padded_tokens=len(computed) * max(item.length for item, _ in computed),
            queue_waits=waits,
            compute_s=compute_s,
        )
        if outcome.oom_splits:
            metrics.oom_splits.labels(*metrics.labels(version)).inc(outcome.oom_splits)
        if outcome.error_id is not None:
            metrics.batch_failures.labels(*metrics.labels(version)).inc()

    def _cache_put(self, key: bytes, result: ItemResult) -> None:
        try:
            self.cache.put(key, result)
        except (TypeError, ValueError):
            # A result the cache cannot size (not JSON-serialisable) is simply not cached;
            # it must never keep the batch's other requests from being answered.
            log.warning("result not cacheable", exc_info=True)


def _bounded(instance: object, max_chars: int, *, truncate: bool) -> object:
    """Cut or refuse a text that cannot fit before the tokenizer spends time on it."""
    if not isinstance(instance, str) or len(instance) <= max_chars:
        return instance
    if truncate:
        return instance[:max_chars]
    msg = f"input of {len(instance)} characters cannot fit max_sequence_length in tokens"
    raise InputTooLong(msg)


def _fail(item: _Item, error: FleetserveError) -> None:
    ticket: _Ticket = item.ticket
    ticket.fail(error)


def _give_up(request: _Request) -> None:
    """The grace past the deadline ran out with items still computing."""
    request.timer = None
    if not request.future.done():
        msg = f"no result {RESULT_GRACE_S:.0f}s after the deadline; the model may be stuck"
        request.future.set_exception(DeadlineExceeded(msg))


def _expire(item: _Item, now: float) -> None:
    waited_ms = (now - item.enqueued_at) * 1000
    _fail(item, DeadlineExceeded(f"deadline passed after {waited_ms:.0f} ms in the queue"))
