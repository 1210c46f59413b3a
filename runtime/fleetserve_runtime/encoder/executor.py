"""Runs batches off the event loop: one thread prepares batch k+1 while another computes batch k.

The prepare thread collates a batch into pooled buffers and moves it to the device (on CUDA in
its own stream, with an event the compute stream waits on); the compute thread runs forward
and postprocess. A batch that runs out of memory (a CUDA OOM, or the budget check on CPU) is
split in half and retried, down to single requests; only those that still do not fit get
`OutOfMemory`. Any other exception fails that batch alone, with an error id in the log and in
each response. Outcomes go to `on_done`, called on the compute thread: the encoder engine
(`encoder.engine`), which builds the executor, hops them to the event loop.

Until a batch starts computing, its requests can be withdrawn (deadline passed, caller gone):
while it waits behind a running batch, it holds its requests out of the queue, and they must
not wait for that batch however long it runs. Withdrawn requests are never computed; the rest
of the batch is collated again without them, and a batch left empty is skipped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fleetserve_runtime.core.errors import (
    BatchFailed,
    DeadlineExceeded,
    FleetserveError,
    OutOfMemory,
)
from fleetserve_runtime.core.liveness import RunningBatch
from fleetserve_runtime.core.memory import (
    BufferLease,
    BufferPool,
    MeasuresMemory,
    MemoryProfile,
    measure_bytes,
)
from fleetserve_runtime.encoder.batcher import Batch
from fleetserve_runtime.encoder.request_queue import PendingItem
from fleetserve_runtime.models.base import (
    BatchLayout,
    CollateContext,
    ItemResult,
    ModelHandler,
    PreparedInput,
)
from fleetserve_runtime.models.registry import LoadedModel

__all__ = [
    "BatchJob",
    "BatchOutcome",
    "Executor",
    "device_memory",
    "resolve_device",
    "set_threads",
]

log = logging.getLogger("fleetserve.executor")


def resolve_device(setting: str) -> torch.device:
    """`auto` → CUDA when available, else CPU; `cuda` without a GPU is a startup error."""
    if setting == "cuda" and not torch.cuda.is_available():
        msg = "device 'cuda' requested but no CUDA device is available"
        raise RuntimeError(msg)
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def set_threads(threads: int) -> None:
    """Set torch's intra-op thread count (the server is usually pinned to few cores)."""
    torch.set_num_threads(threads)


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(allocated, reserved) bytes of the CUDA caching allocator; None on CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)


@dataclass(slots=True, eq=False)
class BatchJob:
    """A batch on its way through the executor; the prepare thread fills the later fields."""

    batch: Batch[LoadedModel]
    model: LoadedModel
    layout: BatchLayout
    lease: BufferLease | None = None
    prepared: Any = None
    prep_error: BaseException | None = None
    ready: Any = None
    """CUDA event recorded after the copy, or None on CPU."""
    prep_s: float = 0.0
    started: bool = False
    """Set, under the executor's lock, when compute begins: nothing is withdrawn after."""
    withdrawn: set[int] = field(default_factory=set)
    """Indices of items withdrawn before compute began."""


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What happened to a batch: one result (or error) per item, in batch order."""

    job: BatchJob
    results: list[ItemResult | FleetserveError]
    compute_started_at: float
    compute_s: float
    oom_splits: int = 0
    error_id: str | None = None
    withdrawn: frozenset[int] = frozenset()
    """Items not computed (withdrawn before compute began); their results are placeholders."""


@dataclass(slots=True)
class _Pace:
    """Moving averages of compute seconds per real token and of prepare seconds per batch.

    The scheduler asks how long the running batch has left, so it can form the next batch
    just before the device frees up (bigger batches, still prepared in time) instead of as
    soon as the queue delay passes.
    """

    per_token_s: float = 0.0
    prep_s: float = 0.0
    alpha: float = 0.2

    def expected_s(self, real_tokens: int) -> float | None:
        """Compute seconds a batch of `real_tokens` should take; None before any was measured."""
        return self.per_token_s * real_tokens if self.per_token_s else None

    def update(self, *, compute_s: float, real_tokens: int, prep_s: float) -> None:
        """Fold one finished batch into the averages."""
        per_token = compute_s / max(real_tokens, 1)
        if self.per_token_s == 0.0:
            self.per_token_s, self.prep_s = per_token, prep_s
            return
        self.per_token_s += self.alpha * (per_token - self.per_token_s)
        self.prep_s += self.alpha * (prep_s - self.prep_s)


def _owned(result: ItemResult) -> ItemResult:
    """A numpy result that owns its memory.

    A view could point into a pooled input buffer that the next batch overwrites, or keep a
    whole batch's output alive behind one cached row.
    """
    if isinstance(result, np.ndarray) and result.base is not None:
        return result.copy()
    return result


def _refill(
    kept: list[ItemResult | FleetserveError], withdrawn: frozenset[int], size: int
) -> list[ItemResult | FleetserveError]:
    """Results in batch order, a placeholder at each withdrawn index (already answered)."""
    computed = iter(kept)
    placeholder = DeadlineExceeded("withdrawn before its batch was computed")
    return [placeholder if n in withdrawn else next(computed) for n in range(size)]


LOGGED_REQUEST_IDS = 32
"""Most request ids one batch log record lists; the batch size is in the record too."""


def _request_ids(items: Sequence[PendingItem[LoadedModel]]) -> list[str]:
    """The distinct request ids of `items`, in batch order, at most `LOGGED_REQUEST_IDS`."""
    ids = dict.fromkeys(item.request_id for item in items if item.request_id is not None)
    return list(ids)[:LOGGED_REQUEST_IDS]


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, OutOfMemory | torch.cuda.OutOfMemoryError)


def _refused_alone(exc: Exception, payloads: list[PreparedInput]) -> OutOfMemory | None:
    """A lone request's refusal when its run ran out of memory (`exc`); None for several.

    Several requests are split in halves and run again; an error other than running out of
    memory is raised again.
    """
    if not _is_oom(exc):
        raise exc
    if len(payloads) == 1:
        return OutOfMemory(f"request does not fit in memory: {exc}")
    return None


class Executor:
    """Two worker threads (prepare, compute) with a pipeline depth of two batches."""

    PIPELINE_DEPTH = 2

    def __init__(
        self,
        *,
        device: torch.device,
        pool: BufferPool,
        budget_bytes: int,
        reserve_fraction: float,
        on_done: Callable[[BatchOutcome], None],
        log_sample: int = 100,
    ) -> None:
        self.device = device
        self._pool = pool
        self._budget_bytes = budget_bytes
        self._reserve_fraction = reserve_fraction
        self._on_done = on_done
        self._log_sample = log_sample
        self._prep_q: queue.SimpleQueue[BatchJob | None] = queue.SimpleQueue()
        self._compute_q: queue.Queue[BatchJob | None] = queue.Queue(maxsize=1)
        self._inflight = 0
        self._lock = threading.Lock()
        self._batches = 0
        self._pace = _Pace()
        self._running: RunningBatch | None = None
        """The batch computing now (start on the `perf_counter` clock)."""
        self._preparing: RunningBatch | None = None
        """The batch being collated now (start on the `perf_counter` clock)."""
        self._stream = (
            torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # untyped upstream
            if device.type == "cuda"
            else None
        )
        self._threads = [
            threading.Thread(target=self._prepare_loop, name="fleetserve-prepare", daemon=True),
            threading.Thread(target=self._compute_loop, name="fleetserve-compute", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def has_capacity(self) -> bool:
        """True while fewer than `PIPELINE_DEPTH` batches are in the executor."""
        return self._inflight < self.PIPELINE_DEPTH

    def remaining_s(self) -> float | None:
        """Estimated seconds until the running batch ends, less the time to prepare the next.

        None when no batch is computing or nothing has been measured yet.
        """
        running = self._running
        if running is None or running.expected_s is None:
            return None
        ends = running.started + running.expected_s - self._pace.prep_s
        return max(0.0, ends - time.perf_counter())

    def running(self) -> RunningBatch | None:
        """The older of the batches being prepared and computed now; None when both are idle.

        Its start is on the `time.perf_counter` clock. A hung `collate` wedges the executor
        as surely as a hung forward pass: liveness judges whichever has run longer.
        """
        busy = [batch for batch in (self._preparing, self._running) if batch is not None]
        return min(busy, key=lambda batch: batch.started, default=None)

    def withdraw(self, job: BatchJob, index: int) -> bool:
        """Take item `index` out of `job` unless its compute began; True when it was taken.

        Callable from any thread; the caller answers the withdrawn request itself.
        """
        with self._lock:
            if job.started:
                return False
            job.withdrawn.add(index)
            return True

    def submit(self, job: BatchJob) -> None:
        """Hand a batch to the prepare thread; call only when `has_capacity`."""
        with self._lock:
            self._inflight += 1
        self._prep_q.put(job)

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish queued batches, then stop both threads."""
        self._prep_q.put(None)
        for thread in self._threads:
            thread.join(timeout_s)

    def _prepare_loop(self) -> None:
        while (job := self._prep_q.get()) is not None:
            started = time.perf_counter()
            self._preparing = RunningBatch(started, self._pace.prep_s or None)
            try:
                job.lease = self._pool.lease()
                job.prepared, job.ready = self._collate(
                    job.model.handler, [i.payload for i in job.batch.items], job.layout, job.lease
                )
            except Exception as exc:  # any collate error fails this batch only
                job.prep_error = exc
            finally:
                self._preparing = None
            job.prep_s = time.perf_counter() - started
            self._compute_q.put(job)
        self._compute_q.put(None)

    def _collate(
        self,
        handler: ModelHandler,
        payloads: Sequence[PreparedInput],
        layout: BatchLayout,
        lease: BufferLease,
    ) -> tuple[Any, Any]:
        ctx = CollateContext(layout, lease, self.device)
        if self._stream is None:
            return handler.collate(payloads, ctx), None
        with torch.cuda.stream(self._stream):
            prepared = handler.collate(payloads, ctx)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped upstream
            event.record(self._stream)
        return prepared, event

    def _compute_loop(self) -> None:
        while (job := self._compute_q.get()) is not None:
            with self._lock:
                job.started = True
                withdrawn = frozenset(job.withdrawn)
            items = job.batch.items
            real_tokens = sum(item.length for n, item in enumerate(items) if n not in withdrawn)
            computes = len(withdrawn) < len(items)
            started = time.perf_counter()
            if computes:
                self._running = RunningBatch(started, self._pace.expected_s(real_tokens))
            outcome = self._compute(job, started, withdrawn)
            self._running = None
            if computes:
                self._pace.update(
                    compute_s=outcome.compute_s, real_tokens=real_tokens, prep_s=job.prep_s
                )
            with self._lock:
                self._inflight -= 1
            self._batches += 1
            if self._batches % self._log_sample == 0:
                log.info(
                    "batch",
                    extra={
                        "size": len(job.batch.items),
                        "pad_to": job.batch.pad_to,
                        "real_tokens": job.batch.real_tokens,
                        "prep_ms": round(job.prep_s * 1000, 3),
                        "compute_ms": round(outcome.compute_s * 1000, 3),
                        "oom_splits": outcome.oom_splits,
                        "request_ids": _request_ids(job.batch.items),
                    },
                )
            self._on_done(outcome)

    def _compute(self, job: BatchJob, started: float, withdrawn: frozenset[int]) -> BatchOutcome:
        items = job.batch.items
        payloads = [item.payload for n, item in enumerate(items) if n not in withdrawn]
        try:
            if withdrawn:
                # The prepared tensors hold the withdrawn requests too: collate the rest anew.
                job.prepared = None
                kept, splits = self._run_subset(job, payloads) if payloads else ([], 0)
                results = _refill(kept, withdrawn, len(items))
            elif job.prep_error is not None and _is_oom(job.prep_error) and len(items) > 1:
                # Collating (e.g. the host-to-device copy) ran out of memory: split like a
                # forward-pass OOM rather than failing requests that fit on their own.
                job.prepared = None
                results, splits = self._split(job, payloads)
            elif job.prep_error is not None:
                raise job.prep_error
            else:
                if job.ready is not None:
                    torch.cuda.current_stream(self.device).wait_event(job.ready)
                results, splits = self._execute(job, payloads, job.prepared)
            compute_s = time.perf_counter() - started
            return BatchOutcome(job, results, started, compute_s, splits, withdrawn=withdrawn)
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            log.exception(
                "batch failed",
                extra={
                    "error_id": error_id,
                    "size": len(items),
                    "request_ids": _request_ids(items),
                },
            )
            failed = BatchFailed(f"inference failed (error id {error_id})", error_id=error_id)
            results_failed: list[ItemResult | FleetserveError] = [failed] * len(items)
            compute_s = time.perf_counter() - started
            return BatchOutcome(job, results_failed, started, compute_s, 0, error_id, withdrawn)
        finally:
            if job.lease is not None:
                job.lease.release()

    def _execute(
        self, job: BatchJob, payloads: list[PreparedInput], prepared: Any
    ) -> tuple[list[ItemResult | FleetserveError], int]:
        handler = job.model.handler
        try:
            self._check_budget(job.model.memory, len(payloads) * job.layout.pad_to)
            with torch.inference_mode():
                output = handler.forward(prepared)
            results = [_owned(result) for result in handler.postprocess(output, len(payloads))]
            if len(results) != len(payloads):
                msg = f"postprocess returned {len(results)} results for {len(payloads)} items"
                raise RuntimeError(msg)
            return results, 0
        except Exception as exc:
            refused = _refused_alone(exc, payloads)
            if refused is not None:
                return [refused], 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return self._split(job, payloads)

    def _split(
        self, job: BatchJob, payloads: list[PreparedInput]
    ) -> tuple[list[ItemResult | FleetserveError], int]:
        results: list[ItemResult | FleetserveError] = []
        splits = 1
        middle = len(payloads) // 2
        for half in (payloads[:middle], payloads[middle:]):
            half_results, half_splits = self._run_subset(job, half)
            results.extend(half_results)
            splits += half_splits
        return results, splits

    def _run_subset(
        self, job: BatchJob, payloads: list[PreparedInput]
    ) -> tuple[list[ItemResult | FleetserveError], int]:
        """Collate and run part of a batch, splitting further if it still OOMs.

        The part is a half of a batch that ran out of memory, or the requests of a batch that
        were not withdrawn.
        """
        layout = replace(job.layout, pad_to=max(p.length for p in payloads))
        lease = self._pool.lease()
        try:
            try:
                prepared, ready = self._collate(job.model.handler, payloads, layout, lease)
            except Exception as exc:
                refused = _refused_alone(exc, payloads)
                if refused is not None:
                    return [refused], 0
                return self._split(job, payloads)
            if ready is not None:
                torch.cuda.current_stream(self.device).wait_event(ready)
            return self._execute(replace(job, layout=layout), payloads, prepared)
        finally:
            lease.release()

    def _check_budget(self, memory: MemoryProfile | None, padded_tokens: int) -> None:
        """On CPU, refuse a batch the measured profile says will not fit (CUDA raises itself)."""
        budget = self._budget_bytes
        if memory is None or not budget or self.device.type == "cuda":
            return
        need = memory.weights_bytes + memory.batch_bytes(padded_tokens)
        limit = budget * (1 - self._reserve_fraction)
        if need > limit:
            msg = f"batch needs {need} bytes, budget allows {int(limit)}"
            raise OutOfMemory(msg)

    def run_shapes(
        self,
        handler: ModelHandler,
        shapes: Sequence[tuple[int, int]],
        *,
        packed: bool,
        measure: bool,
    ) -> list[tuple[int, int]]:
        """Run one batch per (batch size, length) shape, off the serving threads.

        Used for warmup and, with `measure`, for memory calibration: returns
        (padded tokens, peak bytes) per shape that fit (peak 0 when not measuring); shapes
        that run out of memory are left out. A handler that allocates outside torch
        (`MeasuresMemory`) measures its own batches.
        """
        samples: list[tuple[int, int]] = []
        for size, length in shapes:
            instance = handler.sample_instance(length)
            payloads = [handler.preprocess(instance, truncate=True) for _ in range(size)]
            layout = BatchLayout(pad_to=max(p.length for p in payloads), packed=packed)
            lease = self._pool.lease()

            def run(payloads: list[PreparedInput] = payloads, layout: BatchLayout = layout,
                    lease: BufferLease = lease) -> None:  # fmt: skip
                prepared = handler.collate(payloads, CollateContext(layout, lease, self.device))
                with torch.inference_mode():
                    handler.postprocess(handler.forward(prepared), len(payloads))

            peak = 0
            try:
                if measure and isinstance(handler, MeasuresMemory):
                    peak = handler.batch_peak_bytes(run)
                elif measure:
                    peak = measure_bytes(run, self.device)[0]
                else:
                    run()
            except Exception as exc:
                if not _is_oom(exc):
                    raise
                # A shape that does not fit tells us the limit is below it; skip it.
                log.warning("warmup shape out of memory", extra={"size": size, "length": length})
                continue
            finally:
                lease.release()
            samples.append((size * layout.pad_to, peak))
        return samples

    def load(self, handler: ModelHandler) -> int:
        """Load `handler` onto the device; returns the bytes it kept (its weights)."""
        _, retained = measure_bytes(lambda: handler.load(self.device), self.device)
        return retained
