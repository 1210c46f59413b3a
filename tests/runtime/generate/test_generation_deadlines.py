"""A generation's deadline comes from the `generation` section, not the encoder queue's.

A whole answer streams for seconds to minutes, so the encoder's per-request default (5 s)
would cut ordinary answers off; these tests pin which setting bounds a generation.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleetserve_runtime.core.errors import DeadlineExceeded
from fleetserve_runtime.generate.contracts import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import make_config

SLOW = "builtin://synthetic-generate?per_token_ms=20&output_tokens=12"
"""About 13 steps of 20 ms: a quarter of a second per answer."""


async def answer(runtime: Runtime) -> list[object]:
    """Every event of one greedy generation."""
    stream = await runtime.generate(
        GenerationRequest(SamplingParams(max_tokens=16, temperature=0.0), prompt="one two")
    )
    return [event async for event in stream]


async def test_the_encoder_queue_deadline_does_not_cut_a_generation() -> None:
    """An encoder default of 50 ms leaves a 250 ms generation untouched."""
    runtime = Runtime(make_config(model=SLOW, queue={"default_timeout_ms": 50}))
    await runtime.start()
    try:
        await runtime.wait_ready()
        events = await answer(runtime)
    finally:
        await runtime.stop()
    assert isinstance(events[-1], FinishEvent)
    assert sum(isinstance(event, TokenEvent) for event in events) >= 12


async def test_the_generation_deadline_cuts_a_generation() -> None:
    """`generation.default_timeout_ms` bounds the answer: 50 ms ends it with a 504 error."""
    runtime = Runtime(make_config(model=SLOW, generation={"default_timeout_ms": 50}))
    await runtime.start()
    try:
        await runtime.wait_ready()
        try:
            events = await answer(runtime)
        except DeadlineExceeded:
            events = []  # cut before its first token: raised, as the stream had not begun
    finally:
        await runtime.stop()
    if events:  # cut mid-stream: an error event ends it
        assert isinstance(events[-1], ErrorEvent)
        assert isinstance(events[-1].error, DeadlineExceeded)
    assert sum(isinstance(event, TokenEvent) for event in events) < 12


def test_the_default_may_not_exceed_the_maximum() -> None:
    """A default deadline above the maximum is refused, naming both fields."""
    message = r"generation\.max_timeout_ms \(5000\) must be >= generation\.default_timeout_ms"
    with pytest.raises(ValidationError, match=message):
        make_config(generation={"default_timeout_ms": 10_000, "max_timeout_ms": 5_000})
