"""The synthetic generative model: deterministic words, EOS on time, errors on purpose.

Driven directly through the `CausalLM` protocol (a greedy loop over a real KV pool), so each
property is checked on the model itself, independent of the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from fleetserve_runtime.models.causal_lm import ChatMessage, SeqChunk, StepInput
from fleetserve_runtime.models.synthetic_lm import (
    EOS_ID,
    WORDS,
    SyntheticCodec,
    SyntheticGenerativeParams,
    SyntheticLM,
    SyntheticStepError,
)

BLOCK = 4
CPU = torch.device("cpu")


def model(**params: object) -> tuple[SyntheticLM, SyntheticCodec]:
    parsed = SyntheticGenerativeParams.model_validate({"per_token_ms": 0, **params})
    codec = SyntheticCodec(parsed.vocab)
    lm = SyntheticLM(parsed, codec, CPU)
    lm.allocate_cache(64, BLOCK)
    return lm, codec


def greedy(
    lm: SyntheticLM,
    prompt: Sequence[int],
    *,
    max_tokens: int = 100,
    chunk: int = 1000,
    first_block: int = 0,
) -> list[int]:
    """Prefill `prompt` in chunks of `chunk` tokens, then decode greedily until EOS."""
    table = list(range(first_block, first_block + 32))
    tokens = list(prompt)
    logits = torch.empty(0)
    for start in range(0, len(tokens), chunk):
        piece = tokens[start : start + chunk]
        logits = lm.forward(StepInput([SeqChunk(piece, start, table)]))
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(logits[0].argmax())
        out.append(token)
        if token == EOS_ID:
            break
        logits = lm.forward(StepInput([SeqChunk([token], len(tokens), table)]))
        tokens.append(token)
    return out


def test_output_is_words_and_ends_after_output_tokens() -> None:
    """`output_tokens` words from the vocabulary, then end-of-sequence."""
    lm, codec = model(output_tokens=5, vocab=8)
    out = greedy(lm, codec.encode("The capital of France is", add_special=True))
    assert len(out) == 6
    assert out[-1] == EOS_ID
    words = codec.decode(out).split(" ")
    assert len(words) == 5
    assert set(words) <= set(WORDS[:8])


def test_same_prompt_same_text_other_seed_other_text() -> None:
    """The text is a function of prompt and seed only."""
    prompt_text = "tell me a story about the sea"
    lm, codec = model(output_tokens=12)
    prompt = codec.encode(prompt_text, add_special=True)
    first = greedy(lm, prompt)
    again = greedy(model(output_tokens=12)[0], prompt)
    other_seed = greedy(model(output_tokens=12, seed=7)[0], prompt)
    other_prompt = greedy(lm, codec.encode("tell me about the city", add_special=True))
    assert first == again
    assert first != other_seed
    assert first != other_prompt


def test_output_reads_the_cache_so_chunking_and_blocks_do_not_matter() -> None:
    """Prefill in one chunk or many, in any blocks: the cached state decides the same tokens."""
    lm, codec = model(output_tokens=10)
    prompt = codec.encode("one two three four five six seven eight nine", add_special=True)
    whole = greedy(lm, prompt)
    assert greedy(lm, prompt, chunk=3, first_block=20) == whole
    assert greedy(lm, prompt, chunk=1, first_block=7) == whole


def test_a_step_of_several_sequences_answers_each_as_alone() -> None:
    """Batched chunks (a prefill beside a decode) give each sequence its own answer."""
    lm, codec = model()
    first = codec.encode("alpha beta gamma", add_special=True)
    second = codec.encode("delta epsilon", add_special=True)
    alone = [int(greedy(lm, p, max_tokens=1)[0]) for p in (first, second)]
    together = lm.forward(
        StepInput([SeqChunk(first, 0, [0, 1]), SeqChunk(second, 0, [2, 3])])
    ).argmax(dim=1)
    assert together.tolist() == alone


def test_all_logits_give_each_prompt_position_the_row_a_prefix_prefill_would() -> None:
    """A chunk asking for every row gets one per token: what a prefill ending there returns.

    That is what prompt log-probabilities read; the last row is the usual one.
    """
    lm, codec = model()
    prompt = codec.encode("alpha beta gamma delta", add_special=True)
    rows = lm.forward(StepInput([SeqChunk(prompt, 0, [0, 1, 2], all_logits=True)]))
    assert rows.shape[0] == len(prompt)
    for end in range(1, len(prompt) + 1):
        alone = lm.forward(StepInput([SeqChunk(prompt[:end], 0, [3, 4, 5])]))
        assert torch.equal(rows[end - 1], alone[0])


def test_error_rate_fails_the_step_that_feeds_the_first_token_back() -> None:
    """error_rate 1 fails every generation at its first decode step; 0 never fails."""
    lm, codec = model(error_rate=1.0)
    prompt = codec.encode("hello there", add_special=True)
    first = lm.forward(StepInput([SeqChunk(prompt, 0, [0])]))
    token = int(first[0].argmax())
    with pytest.raises(SyntheticStepError, match="error_rate"):
        lm.forward(StepInput([SeqChunk([token], len(prompt), [0])]))
    assert len(greedy(model(error_rate=0.0)[0], prompt)) == 17


def test_error_draws_are_fixed_by_prompt_and_seed() -> None:
    """With error_rate 0.5 some prompts fail, the same ones on every run and every batch."""

    def fails(seed: int) -> list[bool]:
        lm, codec = model(error_rate=0.5, seed=seed)
        outcome: list[bool] = []
        for n in range(16):
            try:
                greedy(lm, codec.encode(f"prompt number {n}", add_special=True))
            except SyntheticStepError:
                outcome.append(True)
            else:
                outcome.append(False)
        return outcome

    first = fails(3)
    assert first == fails(3)
    assert 0 < sum(first) < 16


def test_step_cost_is_per_step_plus_per_prefill_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step asks to sleep per_token_ms once plus prefill_ms_per_token per prompt token."""
    slept: list[float] = []
    monkeypatch.setattr("fleetserve_runtime.models.synthetic_lm.time.sleep", slept.append)
    monkeypatch.setattr("fleetserve_runtime.models.synthetic_lm.time.perf_counter", lambda: 0.0)
    lm, codec = model(per_token_ms=20, prefill_ms_per_token=0.5)
    prompt = codec.encode("a b c d e f g h i j", add_special=True)
    lm.forward(StepInput([SeqChunk(prompt, 0, [0, 1, 2])]))
    lm.forward(StepInput([SeqChunk([5], len(prompt), [0, 1, 2]), SeqChunk(prompt[:4], 0, [9])]))
    assert slept == pytest.approx([(20 + 0.5 * 11) / 1000, (20 + 0.5 * 4) / 1000])


def test_pool_is_really_allocated_at_the_layout_cost() -> None:
    """allocate_cache holds exactly kv_layout.block_bytes per block."""
    lm, _ = model()
    lm.allocate_cache(10, 8)
    pool = lm._pool
    assert pool is not None
    assert pool.numel() * pool.element_size() == 10 * lm.kv_layout.block_bytes(8)


def test_codec_round_trips_and_streams_words() -> None:
    """Output words decode to text, streamed word by word with single spaces."""
    _, codec = model(vocab=80)
    ids = [2, 3, 2 + len(WORDS), 2 + 79]
    decoder = codec.decoder()
    streamed = "".join(decoder.push(i) for i in [*ids, EOS_ID]) + decoder.flush()
    assert streamed == codec.decode(ids) == f"the a the1 {WORDS[79 - len(WORDS)]}1"
    assert codec.encode("x y", add_special=True)[0] == codec.bos_token_id
    assert len(codec.encode("x y z", add_special=False)) == 3
    chat = codec.render_chat([ChatMessage("user", "hi")])
    assert chat == "user: hi\nassistant:"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"per_token_ms": -1}, "per_token_ms"),
        ({"error_rate": 2}, "error_rate"),
        ({"output_tokens": 0}, "output_tokens"),
        ({"vocab": 0}, "vocab"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_params_are_bounded(params: dict[str, object], field: str) -> None:
    """Out-of-range or unknown knobs are refused naming the field."""
    with pytest.raises(ValueError, match=field):
        SyntheticGenerativeParams.model_validate(params)
