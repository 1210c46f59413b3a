"""Executor: pipelining, OOM halving, failure isolation, buffer return; GPU path when present."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from fleetserve_runtime.core.errors import BatchFailed, OutOfMemory
from fleetserve_runtime.core.memory import BufferPool, MemoryProfile
from fleetserve_runtime.encoder.batcher import Batch
from fleetserve_runtime.encoder.executor import BatchJob, BatchOutcome, Executor, resolve_device
from fleetserve_runtime.models.base import BatchLayout, CollateContext, PreparedInput
from fleetserve_runtime.models.registry import LoadedModel
from fleetserve_runtime.models.synthetic import SyntheticHandler, SyntheticParams
from fleetserve_runtime.testing import make_items


class RecordingHandler(SyntheticHandler):
    """Synthetic model that records the order in which each batch's stages ran.

    The first forward pass waits (at most 5 s) for the second batch to be collated: a
    pipelined executor collates it meanwhile, however slow the machine; one that prepares
    only after computing records the second collate after the first forward's end.
    """

    def __init__(self) -> None:
        super().__init__("rec", "v1", params=SyntheticParams(latency_ms=0, per_item_ms=0))
        self.events: list[tuple[str, int]] = []
        self.second_collated = threading.Event()
        self._batch = 0

    def collate(self, items: Sequence[PreparedInput], ctx: CollateContext) -> Any:
        """Collate, recording it, and tag the batch with its number."""
        self._batch += 1
        self.events.append(("collate", self._batch))
        if self._batch == 2:
            self.second_collated.set()
        return (*super().collate(items, ctx), self._batch)

    def forward(self, batch: Any) -> Any:
        """Run the synthetic forward, recording its start and end."""
        seeds, padded, number = batch
        self.events.append(("forward-start", number))
        if number == 1:
            self.second_collated.wait(5)
        out = super().forward((seeds, padded))
        self.events.append(("forward-end", number))
        return out


class Collector:
    """Gathers outcomes from the compute thread."""

    def __init__(self) -> None:
        self.outcomes: list[BatchOutcome] = []
        self.done = threading.Event()
        self.expected = 0

    def __call__(self, outcome: BatchOutcome) -> None:
        """Record one outcome."""
        self.outcomes.append(outcome)
        if len(self.outcomes) >= self.expected:
            self.done.set()


def job(
    handler: SyntheticHandler, lengths: list[int], memory: MemoryProfile | None = None
) -> BatchJob:
    items = make_items(lengths, now=0.0)
    for item, length in zip(items, lengths, strict=True):
        item.payload = handler.preprocess(" ".join(["w"] * (length - 2)), truncate=False)
    batch = Batch(tuple(items), "v1", max(lengths), sum(lengths), 0.0)
    model = LoadedModel(handler, 0.0, memory, 0)
    return BatchJob(batch, model, BatchLayout(pad_to=max(lengths)))


def run(executor_kwargs: dict[str, Any], jobs: list[BatchJob]) -> list[BatchOutcome]:
    collector = Collector()
    collector.expected = len(jobs)
    pool = BufferPool(max_bytes=1 << 20)
    executor = Executor(device=torch.device("cpu"), pool=pool, on_done=collector, **executor_kwargs)
    try:
        for each in jobs:
            while not executor.has_capacity:
                time.sleep(0.001)
            executor.submit(each)
        assert collector.done.wait(10)
    finally:
        executor.close()
    assert pool.stats.leased_bytes == 0, "every buffer returns to the pool"
    return collector.outcomes


DEFAULTS: dict[str, Any] = {"budget_bytes": 0, "reserve_fraction": 0.1}


def test_next_batch_is_prepared_while_the_current_one_computes() -> None:
    """Batch k+1 is collated before batch k's forward pass ends."""
    handler = RecordingHandler()
    run(DEFAULTS, [job(handler, [5, 5]), job(handler, [6, 6])])
    at = {event: n for n, event in enumerate(handler.events)}
    assert at[("collate", 2)] < at[("forward-end", 1)]
    assert at[("forward-start", 2)] > at[("forward-end", 1)]


def test_oom_halves_until_it_fits() -> None:
    """A batch over the limit is split; results come back complete and in order."""
    handler = SyntheticHandler("s", "v1", params=SyntheticParams(latency_ms=0, oom_above_tokens=10))
    (outcome,) = run(DEFAULTS, [job(handler, [5, 5, 5, 5])])
    assert outcome.oom_splits == 1
    assert len(outcome.results) == 4
    assert not any(isinstance(r, Exception) for r in outcome.results)


def test_a_single_request_that_never_fits_gets_out_of_memory() -> None:
    """Only when one request alone does not fit is it answered OutOfMemory."""
    handler = SyntheticHandler("s", "v1", params=SyntheticParams(latency_ms=0, oom_above_tokens=4))
    (outcome,) = run(DEFAULTS, [job(handler, [3, 6])])
    assert not isinstance(outcome.results[0], Exception)
    assert isinstance(outcome.results[1], OutOfMemory)


def test_cpu_budget_check_raises_the_same_oom_path() -> None:
    """On CPU the measured profile refuses a batch that would exceed the budget, then splits."""
    handler = SyntheticHandler("s", "v1", params=SyntheticParams(latency_ms=0))
    profile = MemoryProfile(weights_bytes=100, fixed_bytes=0, bytes_per_token=10)
    kwargs = {"budget_bytes": 250, "reserve_fraction": 0.0}
    (outcome,) = run(kwargs, [job(handler, [10, 10], memory=profile)])
    assert outcome.oom_splits == 1
    assert not any(isinstance(r, Exception) for r in outcome.results)


def test_failing_batch_fails_alone() -> None:
    """An exception in forward fails that batch with an error id; the next batch succeeds."""

    class Flaky(SyntheticHandler):
        calls = 0

        def forward(self, batch: Any) -> Any:
            """Raise on the first call only."""
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("boom")
            return super().forward(batch)

    handler = Flaky("s", "v1", params=SyntheticParams(latency_ms=0))
    first, second = run(DEFAULTS, [job(handler, [5, 5]), job(handler, [5])])
    assert first.error_id is not None
    assert all(isinstance(r, BatchFailed) and r.error_id == first.error_id for r in first.results)
    assert second.error_id is None


def test_results_never_alias_pooled_buffers() -> None:
    """A handler that returns views of its inputs still hands back arrays that own memory."""

    class Echo(SyntheticHandler):
        def forward(self, batch: Any) -> Any:
            """Return the (pooled) input tensor itself."""
            return batch

        def postprocess(self, output: Any, count: int) -> list[Any]:
            """Rows as numpy views of the input buffer."""
            seeds, _ = output
            view = seeds.numpy().reshape(count, 1)
            return [view[i] for i in range(count)]

    handler = Echo("s", "v1", params=SyntheticParams(latency_ms=0))
    (outcome,) = run(DEFAULTS, [job(handler, [5, 6])])
    assert all(r.base is None for r in outcome.results)


def test_wrong_result_count_fails_the_batch_instead_of_hanging() -> None:
    """A postprocess returning too few results is a batch failure (500), never a lost request."""

    class Short(SyntheticHandler):
        def postprocess(self, output: Any, count: int) -> list[Any]:
            """Drop the last result."""
            return super().postprocess(output, count)[:-1]

    handler = Short("s", "v1", params=SyntheticParams(latency_ms=0))
    (outcome,) = run(DEFAULTS, [job(handler, [5, 6])])
    assert outcome.error_id is not None
    assert all(isinstance(r, BatchFailed) for r in outcome.results)


def test_oom_while_collating_splits_the_batch() -> None:
    """Running out of memory while preparing a batch splits it like a forward-pass OOM."""

    class TightCollate(SyntheticHandler):
        def collate(self, items: Sequence[PreparedInput], ctx: CollateContext) -> Any:
            """Refuse batches of more than one item."""
            if len(items) > 1:
                raise OutOfMemory("copy does not fit")
            return super().collate(items, ctx)

    handler = TightCollate("s", "v1", params=SyntheticParams(latency_ms=0))
    (outcome,) = run(DEFAULTS, [job(handler, [5, 6, 7])])
    assert outcome.error_id is None
    assert outcome.oom_splits >= 1
    assert not any(isinstance(r, Exception) for r in outcome.results)


class Gated(SyntheticHandler):
    """Synthetic model whose `hold`-th forward pass waits for `gate`; records each batch."""

    def __init__(self, hold: int) -> None:
        super().__init__("g", "v1", params=SyntheticParams(latency_ms=0, per_item_ms=0))
        self.hold = hold
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.seen: list[list[int]] = []
        """The digests of each forward pass's items, in order."""

    def forward(self, batch: Any) -> Any:
        """Record the batch; wait at the gate if it is the held one."""
        seeds, _ = batch
        self.seen.append(seeds.tolist())
        if len(self.seen) == self.hold:
            self.entered.set()
            assert self.gate.wait(10)
        return super().forward(batch)


@contextmanager
def executor_for(expected: int) -> Iterator[tuple[Executor, Collector]]:
    """An executor whose outcomes a collector waits for; closed on exit."""
    collector = Collector()
    collector.expected = expected
    pool = BufferPool(max_bytes=1 << 20)
    executor = Executor(device=torch.device("cpu"), pool=pool, on_done=collector, **DEFAULTS)
    try:
        yield executor, collector
        assert collector.done.wait(10)
    finally:
        executor.close()
    assert pool.stats.leased_bytes == 0, "every buffer returns to the pool"


def digests(each: BatchJob, *indices: int) -> list[int]:
    return [each.batch.items[i].payload.data for i in indices]


@dataclass(frozen=True)
class Withdrawal:
    """What `withdraw_behind_a_running_batch` ran, and the outcomes of its two batches."""

    handler: Gated
    first: BatchJob
    second: BatchJob
    executor: Executor
    outcomes: list[BatchOutcome]


def withdraw_behind_a_running_batch(*indices: int) -> Withdrawal:
    """Withdraw `indices` of a two-item batch waiting behind a computing one; then run both."""
    handler = Gated(hold=1)
    first, second = job(handler, [5]), job(handler, [6, 7])
    with executor_for(2) as (executor, collector):
        executor.submit(first)
        assert handler.entered.wait(10)
        executor.submit(second)
        for index in indices:
            assert executor.withdraw(second, index)
        assert not executor.withdraw(first, 0), "a computing batch keeps its requests"
        handler.gate.set()
    return Withdrawal(handler, first, second, executor, collector.outcomes)


def test_a_withdrawn_request_is_never_computed() -> None:
    """A request withdrawn while its batch waits is left out; the rest of the batch runs."""
    run = withdraw_behind_a_running_batch(0)
    waited = run.outcomes[1]
    assert waited.withdrawn == {0}
    assert isinstance(waited.results[1], np.ndarray)
    assert run.handler.seen == [digests(run.first, 0), digests(run.second, 1)]


def test_a_batch_whose_requests_were_all_withdrawn_is_skipped() -> None:
    """Nothing runs for a batch left empty, and the executor takes work again."""
    run = withdraw_behind_a_running_batch(0, 1)
    assert run.outcomes[1].withdrawn == {0, 1}
    assert run.handler.seen == [digests(run.first, 0)]
    assert run.executor.has_capacity


def test_the_running_batch_carries_its_expected_time_once_a_pace_is_measured() -> None:
    """Liveness judges the running batch against the measured pace; before any, there is none."""
    unmeasured, measured = Gated(hold=1), Gated(hold=2)
    with executor_for(1) as (executor, _):
        executor.submit(job(unmeasured, [5]))
        assert unmeasured.entered.wait(10)
        running = executor.running()
        unmeasured.gate.set()
    assert running is not None
    assert running.expected_s is None
    with executor_for(2) as (executor, _):
        executor.submit(job(measured, [5]))
        executor.submit(job(measured, [5, 5]))
        assert measured.entered.wait(10)
        running = executor.running()
        measured.gate.set()
    assert running is not None
    assert running.expected_s is not None
    assert running.expected_s > 0
    assert executor.running() is None


def test_resolve_device() -> None:
    """`auto` picks what exists; asking for CUDA without one is a startup error."""
    assert resolve_device("cpu").type == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            resolve_device("cuda")


@pytest.mark.gpu
def test_cuda_stream_path_matches_cpu() -> None:
    """On a GPU the prepare stream + event path returns the same results as the CPU path."""
    handler = SyntheticHandler("s", "v1", params=SyntheticParams(latency_ms=0))
    collector = Collector()
    collector.expected = 1
    executor = Executor(
        device=torch.device("cuda"), pool=BufferPool(max_bytes=1 << 20, pin=True),
        on_done=collector, **DEFAULTS,
    )  # fmt: skip
    try:
        executor.submit(job(handler, [5, 6, 7]))
        assert collector.done.wait(30)
    finally:
        executor.close()
    (cpu_outcome,) = run(DEFAULTS, [job(handler, [5, 6, 7])])
    for gpu_row, cpu_row in zip(collector.outcomes[0].results, cpu_outcome.results, strict=True):
        assert gpu_row == pytest.approx(cpu_row, abs=1e-5)
