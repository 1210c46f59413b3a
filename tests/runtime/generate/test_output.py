"""Output processing: stop strings, end-of-sequence tokens, usage, a token that fails to decode."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fleetserve_runtime.core.errors import BatchFailed
from fleetserve_runtime.generate.contracts import FinishReason
from tests.runtime.generate.engine_fakes import (
    AsciiCodec,
    AsciiDecoder,
    collect,
    request,
    running_engine,
    texts,
)


async def test_stop_strings_are_cut_and_end_the_generation() -> None:
    """The output ends before the first stop string; the reason is stop."""
    async with running_engine() as engine:
        full = await collect(await engine.submit(request("stop test", 30)))
        stop = full.text[10:13]
        cut = await collect(
            await engine.submit(request("stop test", 30, temperature=0.0, stop=(stop, "no such")))
        )
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.finish.reason is FinishReason.STOP
    assert cut.finish.usage.completion_tokens == full.text.index(stop) + len(stop)
    assert full.finish.reason is FinishReason.LENGTH


async def test_an_end_of_sequence_token_stops_unless_ignored() -> None:
    """EOS ends the output (not emitted); ignore_eos runs on to max_tokens."""
    async with running_engine() as engine:
        full = await collect(await engine.submit(request("eos test", 20)))
    eos_token = full.token_ids[7]
    first = full.token_ids.index(eos_token)
    async with running_engine(codec=AsciiCodec(frozenset({eos_token}))) as engine:
        ended = await collect(await engine.submit(request("eos test", 20)))
        ignored = await collect(
            await engine.submit(request("eos test", 20, temperature=0.0, ignore_eos=True))
        )
    assert ended.text == full.text[:first]
    assert ended.finish.reason is FinishReason.STOP
    assert ended.finish.usage.completion_tokens == first + 1
    assert ignored.text == full.text
    assert ignored.finish.reason is FinishReason.LENGTH


async def test_usage_counts_prompt_completion_and_cached_tokens() -> None:
    """Usage: prompt tokens as tokenised (BOS included), completion tokens, cached prefix."""
    async with running_engine(prefix_caching=True) as engine:
        stream = await engine.submit(request("abcdefghij", 6))
        first = await collect(stream)
        second = await collect(await engine.submit(request("abcdefghij", 6)))
    assert stream.prompt_tokens == 11
    assert first.finish.usage.prompt_tokens == 11
    assert first.finish.usage.completion_tokens == 6
    assert first.finish.usage.cached_tokens == 0
    assert second.finish.usage.cached_tokens == 8
    assert second.text == first.text


class BrokenDecoder(AsciiDecoder):
    """A decoder that raises on its first token, as a tokenizer refusing an odd id would."""

    def push(self, token_id: int) -> str:
        """Always fails."""
        msg = f"cannot decode token {token_id}"
        raise ValueError(msg)


@dataclass
class OneBrokenDecoderCodec(AsciiCodec):
    """`AsciiCodec` whose decoder for the `broken`-th submitted sequence (from 0) raises."""

    broken: int = 0
    made: int = 0

    def decoder(self) -> AsciiDecoder:
        """A working decoder, except for the `broken`-th sequence."""
        self.made += 1
        return BrokenDecoder() if self.made - 1 == self.broken else AsciiDecoder()


async def test_a_sequence_whose_text_fails_to_decode_fails_alone() -> None:
    """Decoding that raises for one sequence fails it; its step's others finish unchanged."""
    async with running_engine() as alone:
        expected = [await collect(await alone.submit(request(p, 12))) for p in ("one", "two")]
    async with running_engine(codec=OneBrokenDecoderCodec(broken=1)) as engine:
        streams = [await engine.submit(request(p, 12)) for p in ("one", "bad", "two")]
        results = await asyncio.gather(*(collect(s) for s in streams), return_exceptions=True)
        assert isinstance(results[1], BatchFailed)
        assert [texts([r]) for r in (results[0], results[2])] == [texts([e]) for e in expected]
        assert engine.is_running
        assert engine.stats().free_blocks == 512
