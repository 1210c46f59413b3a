"""A generation's stream: its deadline before and after the first token, and `aclose`."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fleetserve_runtime.core.errors import DeadlineExceeded
from fleetserve_runtime.generate.contracts import (
    ErrorEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from fleetserve_runtime.generate.stream import GenerationStream
from fleetserve_runtime.testing import until
from tests.runtime.generate.engine_fakes import PagedEcho, collect, request, running_engine


async def test_a_deadline_before_the_first_token_raises_504() -> None:
    """A request whose deadline passes while it waits raises DeadlineExceeded, frees all."""
    gate = threading.Event()
    lm = PagedEcho(gate=gate)
    async with running_engine(lm) as engine:
        stream = await engine.submit(
            GenerationRequest(sampling=SamplingParams(max_tokens=5), prompt="hi", timeout_s=0.05)
        )
        with pytest.raises(DeadlineExceeded, match="before the first token"):
            await anext(stream)
        gate.set()
        await until(lambda: engine.stats().running == 0 and engine.stats().free_blocks == 512)


async def test_a_deadline_after_the_first_token_ends_the_stream_with_an_error_event() -> None:
    """Once tokens flowed, a passed deadline is an ErrorEvent and the stream's last event."""
    async with running_engine(PagedEcho(step_delay_s=0.01)) as engine:
        stream = await engine.submit(
            GenerationRequest(
                sampling=SamplingParams(max_tokens=400, temperature=0.0),
                prompt="slow",
                timeout_s=0.5,
            )
        )
        events = [event async for event in stream]
        assert isinstance(events[0], TokenEvent)
        assert isinstance(events[-1], ErrorEvent)
        assert isinstance(events[-1].error, DeadlineExceeded)
        assert all(isinstance(event, TokenEvent) for event in events[:-1])


async def test_cancelling_a_stream_frees_its_blocks_within_one_step() -> None:
    """After `aclose`, the sequence is in at most the step already running, then leaves."""
    lm = PagedEcho(step_delay_s=0.01)
    async with running_engine(lm, prefix_caching=False) as engine:
        other = asyncio.create_task(collect(await engine.submit(request("other", 40))))
        stream = await engine.submit(request("cancel me", 400))
        async for event in stream:
            assert isinstance(event, TokenEvent)
            break
        steps_at_close = len(lm.steps)
        await stream.aclose()
        result = await other
        after = lm.steps[steps_at_close + 1 :]
        assert after
        assert all(len(step) == 1 for step in after)
        assert len(result.text) == 40
        assert engine.stats().free_blocks == 512
        assert engine.stats().running == 0


async def test_a_stream_reaches_its_sequence_only_through_the_callbacks_it_was_given() -> None:
    """`aclose` cancels once and says the stream ended once; events after the end are dropped."""
    ended: list[str] = []
    stream = GenerationStream(prompt_tokens=3, request_id="r", on_end=lambda: ended.append("end"))
    stream.watch(60.0, lambda: ended.append("cancel"))
    stream.push([TokenEvent("a", (97,))])
    assert await anext(stream) == TokenEvent("a", (97,))
    await stream.aclose()
    await stream.aclose()
    stream.push([TokenEvent("b", (98,))])
    assert ended == ["end", "cancel"]
    assert [event async for event in stream] == []
