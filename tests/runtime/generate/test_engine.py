"""The engine's door and lifecycle: the queue's bound, stopping, a dead worker."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fleetserve_runtime.core.errors import ModelNotReady, QueueFull
from fleetserve_runtime.models.causal_lm import StepInput
from fleetserve_runtime.testing import until
from tests.runtime.generate.engine_fakes import (
    LONG_PROMPT,
    GatedCodec,
    PagedEcho,
    collect,
    make_engine,
    request,
    running_engine,
)


async def test_a_full_queue_refuses_with_retry_after_before_any_event() -> None:
    """With the waiting queue at its bound, submit raises QueueFull carrying Retry-After."""
    gate = threading.Event()
    lm = PagedEcho(gate=gate)
    codec = GatedCodec()
    async with running_engine(
        lm, codec=codec, max_running_sequences=1, max_queue_size=2, retry_after_s=3.0
    ) as engine:
        running = await engine.submit(request("a"))
        await asyncio.to_thread(lm.in_step.wait, 5)
        waiting = [await engine.submit(request(p)) for p in ("b", "c")]
        with pytest.raises(QueueFull) as refused:
            await engine.submit(request("d"))
        assert refused.value.retry_after_s == 3.0
        assert "2 of 2 waiting" in refused.value.message
        assert len(codec.threads) == 3  # the refused prompt cost no tokenising
        gate.set()
        for stream in (running, *waiting):
            assert len((await collect(stream)).text) == 12


async def test_an_engine_stopped_while_a_prompt_is_tokenised_refuses_it() -> None:
    """Not a stream nobody will ever end: the request is refused with ModelNotReady."""
    gate = threading.Event()
    codec = GatedCodec(gate=gate)
    engine = make_engine(codec=codec, context_length=8192, num_blocks=4096)
    submitting = asyncio.create_task(engine.submit(request(LONG_PROMPT, 3)))
    await asyncio.to_thread(codec.encoding.wait, 5)
    await engine.stop()
    gate.set()
    with pytest.raises(ModelNotReady):
        await submitting
    assert engine.open_streams == 0


async def test_stop_fails_everything_pending() -> None:
    """Stopping the engine answers waiting and running streams with ModelNotReady."""
    gate = threading.Event()
    lm = PagedEcho(gate=gate)
    engine = make_engine(lm, max_running_sequences=1)
    running = await engine.submit(request("a"))
    await asyncio.to_thread(lm.in_step.wait, 5)
    # The worker is inside a step: this one is still in the engine's inbox.
    arriving = await engine.submit(request("b"))
    stopping = asyncio.create_task(engine.stop())
    await asyncio.sleep(0.01)
    gate.set()
    await stopping
    for stream in (running, arriving):
        with pytest.raises(ModelNotReady):
            await collect(stream)
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.free_blocks) == (0, 0, 512)
    with pytest.raises(ModelNotReady):
        await engine.submit(request("late"))


class WorkerKilled(BaseException):
    """Escapes the engine's per-step error handling, as a bug in the loop itself would."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_worker_thread_that_died_is_reported_and_takes_no_new_requests() -> None:
    """A dead worker never serves again: `worker_died` tells liveness, `submit` refuses."""

    def kill(step: StepInput) -> bool:
        raise WorkerKilled

    async with running_engine(PagedEcho(fail_when=kill)) as engine:
        assert not engine.worker_died
        stranded = await engine.submit(request("doomed", 4))
        await until(lambda: engine.worker_died)
        assert not engine.is_running
        with pytest.raises(ModelNotReady):
            await engine.submit(request("next", 4))
    assert not engine.worker_died, "a stopped engine is not a dead one"
    with pytest.raises(ModelNotReady):
        await collect(stranded)
