"""`n` > 1: the choices of one request share its prompt's KV blocks and its stream."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

from fleetserve_runtime.generate.contracts import FinishEvent, GenerationEvent, TokenEvent
from fleetserve_runtime.testing import until
from tests.runtime.generate.engine_fakes import PagedEcho, request, running_engine

PROMPT = "the choices share this prompt"
"""30 tokens with BOS: 7 full blocks of 4, and one partial block."""
BLOCK = 4


async def test_the_choices_hit_the_first_ones_prompt_blocks() -> None:
    """The prompt is computed once; the other choices take its full blocks from the cache.

    The metrics count their hit tokens, and each computes only the partial block.
    """
    lm = PagedEcho()
    async with running_engine(lm) as engine:
        stream = await engine.submit(replace(request(PROMPT, 5), n=3))
        events: list[GenerationEvent] = [event async for event in stream]
        stats = engine.stats()
    prompt = len(PROMPT) + 1
    shared = prompt // BLOCK * BLOCK
    assert stats.prefix_cache_hit_tokens == 2 * shared
    starts = [start for step in lm.steps for start, _ in step]
    assert starts.count(0) == 1
    assert starts.count(shared) == 2
    finishes = [event for event in events if isinstance(event, FinishEvent)]
    assert sorted(finish.index for finish in finishes) == [0, 1, 2]
    assert [finish.final for finish in finishes] == [False, False, True]
    assert finishes[-1].usage.prompt_tokens == prompt
    assert finishes[-1].usage.completion_tokens == 15
    texts = {
        index: "".join(e.text for e in events if isinstance(e, TokenEvent) and e.index == index)
        for index in range(3)
    }
    assert len(set(texts.values())) == 1  # greedy: the same answer three times
    assert stats.running == 0


async def test_cancelling_an_n_request_frees_every_choice() -> None:
    """Closing the stream takes all its choices out of the batch, blocks freed."""
    gate = threading.Event()
    lm = PagedEcho(gate=gate)
    async with running_engine(lm) as engine:
        free = engine.stats().free_blocks
        stream = await engine.submit(replace(request(PROMPT, 200), n=4))
        gate.set()
        await until(lambda: engine.stats().running == 4)
        await stream.aclose()
        await until(lambda: engine.stats().running == 0)
        await asyncio.sleep(0)
        assert engine.stats().free_blocks == free
