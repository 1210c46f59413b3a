"""Log-probabilities: the pure computation, and the engine carrying them to the stream.

`token_logprobs` against torch's own log-softmax and top-k; then the engine over `PagedEcho`,
whose logits are a known function of the history, so every reported number is checked
against an independent computation: output tokens (greedy and sampled: always the raw
distribution), prompt tokens under chunked prefill, a prefix cache the prompt must not
reuse, a preemption in the middle of a prompt, and `echo` with `max_tokens` 0.
"""

from __future__ import annotations

import math

import pytest
import torch
from prometheus_client import CollectorRegistry

from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.generate.contracts import (
    EchoedPrompt,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
)
from fleetserve_runtime.generate.logprobs import prompt_targets, token_logprobs
from fleetserve_runtime.generate.stream import GenerationStream
from tests.runtime.generate.engine_fakes import BOS, AsciiCodec, PagedEcho, running_engine

PROMPT = "the quick brown fox jumps over the lazy dog"


def test_token_logprobs_are_the_log_softmax_with_sorted_alternatives() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 4
    entries = token_logprobs(logits, [7, 0, 49], [3, 0, 20], decode=lambda i: f"<{i}>")

    expected = torch.log_softmax(logits, dim=-1)
    for row, (entry, token, width) in enumerate(zip(entries, [7, 0, 49], [3, 0, 20], strict=True)):
        assert entry.token_id == token
        assert entry.token == f"<{token}>"
        assert entry.logprob == pytest.approx(float(expected[row, token]), abs=1e-6)
        assert len(entry.top) == width
        values = [other.logprob for other in entry.top]
        assert values == sorted(values, reverse=True)
        best = torch.topk(expected[row], width)
        assert [other.token_id for other in entry.top] == best.indices.tolist()
        assert all(other.token == f"<{other.token_id}>" for other in entry.top)


def test_token_logprobs_refuses_a_mismatch_and_too_many_alternatives() -> None:
    logits = torch.zeros(2, 30)
    with pytest.raises(ValueError, match="2 logit rows for 1 tokens"):
        token_logprobs(logits, [1], [0, 0], decode=str)
    with pytest.raises(ValueError, match="top must lie in 0..20"):
        token_logprobs(logits, [1, 2], [0, 21], decode=str)
    assert token_logprobs(torch.zeros(0, 30), [], [], decode=str) == []


def test_prompt_targets_are_the_next_prompt_tokens() -> None:
    tokens = [10, 11, 12, 13, 14, 99]  # a 5-token prompt and one generated token
    assert prompt_targets(tokens, 5, 0, 2) == [11, 12]
    assert prompt_targets(tokens, 5, 2, 3) == [13, 14]  # the last row samples, not scores
    assert prompt_targets(tokens, 5, 4, 1) == []


def raw(history: list[int], token: int) -> float:
    """The reference: `PagedEcho`'s logits after `history`, log-softmaxed, at `token`."""
    return float(torch.log_softmax(PagedEcho.logits(history), dim=-1)[token])


async def events_of(stream: GenerationStream) -> tuple[list[TokenEvent], FinishEvent]:
    tokens: list[TokenEvent] = []
    async for event in stream:
        if isinstance(event, TokenEvent):
            tokens.append(event)
        elif isinstance(event, FinishEvent):
            return tokens, event
        else:
            raise event.error
    pytest.fail("no finish event")


def asking(max_tokens: int = 10, *, prompt: str = PROMPT, **sampling: object) -> GenerationRequest:
    params: dict[str, object] = {"temperature": 0.0, "logprobs": 3, **sampling}
    return GenerationRequest(
        sampling=SamplingParams(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
        prompt=prompt,
    )


def prompt_ids(text: str = PROMPT) -> list[int]:
    return [BOS, *(ord(c) for c in text)]


def check_prompt(prompt: EchoedPrompt | None, top: int) -> None:
    """One entry per prompt token, each the reference's number for that position."""
    ids = prompt_ids()
    assert prompt is not None
    assert prompt.token_ids == tuple(ids)
    assert prompt.text == PROMPT
    assert prompt.logprobs is not None
    assert len(prompt.logprobs) == len(ids)
    assert prompt.logprobs[0] is None
    for position, entry in enumerate(prompt.logprobs[1:], start=1):
        assert entry is not None
        assert entry.token_id == ids[position]
        assert entry.logprob == pytest.approx(raw(ids[:position], ids[position]), abs=1e-5)
        assert len(entry.top) == top


def output_entries(tokens: list[TokenEvent]) -> list[TokenLogprob]:
    return [entry for event in tokens for entry in event.logprobs]


async def test_greedy_output_logprobs_are_the_raw_distribution_and_the_maximum() -> None:
    async with running_engine() as engine:
        tokens, finish = await events_of(await engine.submit(asking()))
    entries = output_entries(tokens)
    generated = [entry.token_id for entry in entries]
    assert len(entries) == finish.usage.completion_tokens == 10
    assert "".join(event.text for event in tokens) == "".join(map(chr, generated))
    history = prompt_ids()
    for entry in entries:
        assert entry.logprob == pytest.approx(raw(history, entry.token_id), abs=1e-5)
        assert (entry.top[0].token_id, entry.top[0].logprob) == (entry.token_id, entry.logprob)
        assert [t.logprob for t in entry.top] == sorted(
            (t.logprob for t in entry.top), reverse=True
        )
        history.append(entry.token_id)
    assert all(event.prompt is None for event in tokens)


async def test_sampled_tokens_report_the_raw_not_the_tempered_distribution() -> None:
    """Temperature and top-k change what is drawn, never the numbers reported."""
    request = asking(temperature=1.7, top_k=5, seed=3, max_tokens=8)
    async with running_engine() as engine:
        tokens, _ = await events_of(await engine.submit(request))
    history = prompt_ids()
    for entry in output_entries(tokens):
        assert entry.logprob == pytest.approx(raw(history, entry.token_id), abs=1e-5)
        history.append(entry.token_id)


async def test_no_logprobs_unless_asked() -> None:
    async with running_engine() as engine:
        tokens, _ = await events_of(await engine.submit(asking(logprobs=None)))
    assert all(event.logprobs == () and event.prompt is None for event in tokens)


@pytest.mark.parametrize("max_step_tokens", [5, 64])
async def test_prompt_logprobs_over_chunked_prefill(max_step_tokens: int) -> None:
    """The prompt's entries come first, whole, however many steps its prefill took."""
    async with running_engine(max_step_tokens=max_step_tokens, max_running_sequences=2) as engine:
        stream = await engine.submit(asking(4, prompt_logprobs=2, echo=True))
        tokens, finish = await events_of(stream)
    check_prompt(tokens[0].prompt, top=2)
    assert tokens[0].text == ""
    assert len(output_entries(tokens)) == finish.usage.completion_tokens == 4


async def test_only_the_scored_prompt_pays_for_all_its_logits_and_only_once() -> None:
    """Beside a plain request, in chunks: every row of the scored prompt, nothing more."""
    lm = PagedEcho()
    async with running_engine(lm, max_step_tokens=8, max_running_sequences=2) as engine:
        plain = await engine.submit(asking(6, prompt="x" * 20, logprobs=None))
        scored = await engine.submit(asking(6, prompt_logprobs=1, echo=True))
        tokens, _ = await events_of(scored)
        await events_of(plain)
    check_prompt(tokens[0].prompt, top=1)
    assert len(lm.wide) > 1  # chunked
    starts = [start for start, _ in lm.wide]
    assert starts == [0, *(start + length for start, length in lm.wide[:-1])]
    assert sum(length for _, length in lm.wide) == len(prompt_ids())


async def test_prompt_logprobs_do_not_reuse_the_prefix_cache_but_others_still_do() -> None:
    async with running_engine(max_step_tokens=64) as engine:
        _, warm = await events_of(await engine.submit(asking(2, logprobs=None)))
        tokens, scored = await events_of(
            await engine.submit(asking(2, prompt_logprobs=1, echo=True))
        )
        _, again = await events_of(await engine.submit(asking(2, logprobs=None)))
    assert warm.usage.cached_tokens == 0
    assert scored.usage.cached_tokens == 0
    check_prompt(tokens[0].prompt, top=1)
    assert again.usage.cached_tokens > 0


async def test_a_prompt_preempted_mid_prefill_still_reports_each_position_once() -> None:
    """Recomputed positions are not reported twice; the entries stay the reference's.

    The pool holds either sequence alone, not both: the scored one, the newer, is preempted
    while the older one grows, then computes its prompt again.
    """
    lm = PagedEcho()
    async with running_engine(
        lm, num_blocks=16, max_step_tokens=8, max_running_sequences=2
    ) as engine:
        older = await engine.submit(asking(30, prompt="x" * 20, logprobs=None))
        scored = await engine.submit(asking(12, prompt_logprobs=0, echo=True))
        tokens, _ = await events_of(scored)
        await events_of(older)
        assert engine.stats().preemptions > 0
    starts = [chunk for step in lm.steps for chunk in step if chunk[0] == 0]
    assert len(starts) >= 3  # both prompts started, and the scored one started again
    check_prompt(tokens[0].prompt, top=0)


async def test_echo_with_max_tokens_zero_is_the_prompt_alone() -> None:
    registry = CollectorRegistry()
    async with running_engine(registry=registry) as engine:
        tokens, finish = await events_of(
            await engine.submit(asking(0, prompt_logprobs=1, echo=True))
        )
        with pytest.raises(InvalidInput, match="max_tokens must be at least 1"):
            await engine.submit(asking(0))
        with pytest.raises(InvalidInput, match=r"prompt_logprobs must lie in 0..20, got 21"):
            await engine.submit(asking(prompt_logprobs=21))
    assert len(tokens) == 1
    check_prompt(tokens[0].prompt, top=1)
    assert tokens[0].logprobs == ()
    assert (finish.reason.value, finish.usage.completion_tokens) == ("length", 0)
    labels = {"model": "m", "version": "v1", "track": "stable"}
    assert registry.get_sample_value("fleetserve_generation_tokens_total", labels) == 0


async def test_a_final_end_of_sequence_token_is_reported_without_text() -> None:
    """As vLLM reports it, and as lm-evaluation-harness's `[ctxlen:-1]` slice expects."""
    history = prompt_ids()
    first = int(torch.argmax(PagedEcho.logits(history)))
    async with running_engine(codec=AsciiCodec(eos=frozenset({first}))) as engine:
        tokens, finish = await events_of(await engine.submit(asking()))
    assert finish.reason.value == "stop"
    assert [(event.text, [e.token_id for e in event.logprobs]) for event in tokens] == [
        ("", [first])
    ]
    assert math.isfinite(tokens[0].logprobs[0].logprob)
