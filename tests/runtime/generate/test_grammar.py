"""Structured output in the engine: every constrained answer validates, whatever shares its steps.

The paged echo model answers in lower-case letters only, so every `{`, `"` or digit of a
JSON answer is there because the mask allowed nothing else: without the mask not one answer
would parse. Constrained and free sequences share steps (chunked prefill, `n` > 1 choices
sampled at a temperature, preemption by recompute), and the free ones answer exactly as
they do alone.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.generate.contracts import (
    FinishEvent,
    FinishReason,
    GenerationRequest,
    GrammarKind,
    OutputGrammar,
    SamplingParams,
    TokenEvent,
)
from fleetserve_runtime.generate.engine import GenerationEngine
from fleetserve_runtime.generate.grammar import MAX_GRAMMAR_CHARS, GrammarCompiler, mask_logits
from fleetserve_runtime.models.llama.config import Checkpoint
from fleetserve_runtime.models.synthetic_lm import SyntheticCodec
from tests.runtime.generate.engine_fakes import (
    AsciiCodec,
    PagedEcho,
    Result,
    collect,
    request,
    running_engine,
)

NAMED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tags", "ok"],
    "additionalProperties": False,
}
NUMBERS: dict[str, Any] = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 99},
    "minItems": 1,
    "maxItems": 4,
}
PROMPT = "Answer in JSON, please, after a prompt long enough to need several prefill chunks."


def constrained(
    schema: dict[str, Any], prompt: str = PROMPT, n: int = 1, **sampling: Any
) -> GenerationRequest:
    grammar = OutputGrammar(GrammarKind.JSON_SCHEMA, json.dumps(schema))
    params = SamplingParams(max_tokens=64, temperature=0.0, grammar=grammar)
    return GenerationRequest(sampling=replace(params, **sampling), prompt=prompt, n=n)


async def choices(engine: GenerationEngine, body: GenerationRequest) -> list[Result]:
    """Each choice's text (and the finish) of a request, by index."""
    stream = await engine.submit(body)
    texts: dict[int, str] = {}
    finishes: dict[int, FinishEvent] = {}
    async for event in stream:
        if isinstance(event, TokenEvent):
            texts[event.index] = texts.get(event.index, "") + event.text
        elif isinstance(event, FinishEvent):
            finishes[event.index] = event
        else:
            raise event.error
    return [Result(texts.get(i, ""), [], finishes[i]) for i in sorted(finishes)]


def assert_valid(result: Result, schema: dict[str, Any]) -> None:
    assert result.finish.reason == FinishReason.STOP, result.text
    jsonschema.validate(json.loads(result.text), schema)


FREE = [("free prompt one", 20), ("a second free prompt that is longer than a chunk", 9)]


async def test_constrained_and_free_sequences_share_steps() -> None:
    """Two schemas, sampled `n` > 1 choices and free requests in one batch, chunked prefill.

    Every constrained answer validates and ends where its grammar does (before
    `max_tokens`); every free answer is the one it gives alone.
    """
    async with running_engine(max_step_tokens=16) as engine:
        alone = [await collect(await engine.submit(request(p, m))) for p, m in FREE]

    async def free_one(engine: GenerationEngine, prompt: str, max_tokens: int) -> Result:
        return await collect(await engine.submit(request(prompt, max_tokens)))

    async with running_engine(max_step_tokens=16) as engine:
        named, numbers, sampled, free = await asyncio.gather(
            choices(engine, constrained(NAMED)),
            choices(engine, constrained(NUMBERS, "numbers please")),
            choices(engine, constrained(NAMED, n=4, temperature=1.0, seed=7)),
            asyncio.gather(*(free_one(engine, p, m) for p, m in FREE)),
        )
    for result in [*named, *sampled]:
        assert_valid(result, NAMED)
    assert_valid(numbers[0], NUMBERS)
    assert len({r.text for r in sampled}) > 1  # each choice follows its own matcher
    assert [(r.text, r.finish.reason) for r in free] == [(r.text, r.finish.reason) for r in alone]


async def test_a_preempted_constrained_sequence_resumes_its_grammar() -> None:
    """A pool too small for all sequences preempts some; their answers are the unpreempted ones."""
    bodies = [constrained(NAMED, f"prompt number {i} " * 3) for i in range(6)]
    async with running_engine() as engine:
        expected = [(await choices(engine, body))[0].text for body in bodies]
    async with running_engine(num_blocks=40, max_running_sequences=6) as engine:
        results = await asyncio.gather(*(choices(engine, body) for body in bodies))
        assert engine.stats().preemptions > 0
    for result, text in zip(results, expected, strict=True):
        assert_valid(result[0], NAMED)
        assert result[0].text == text


async def test_the_grammar_end_ends_the_sequence() -> None:
    """A schema of one constant ends after its last character, long before `max_tokens`."""
    async with running_engine() as engine:
        (result,) = await choices(engine, constrained({"const": "done"}, max_tokens=50))
    assert result.text == '"done"'
    assert result.finish.reason == FinishReason.STOP
    assert result.finish.usage.completion_tokens == len('"done"')


@pytest.mark.parametrize(
    ("schema", "param", "words"),
    [
        ({"type": "nonsense"}, "response_format", "cannot be enforced"),
        ({"type": "string", "pattern": "x" * MAX_GRAMMAR_CHARS}, "response_format", "limit"),
    ],
)
async def test_a_grammar_that_cannot_be_enforced_is_refused(
    schema: dict[str, Any], param: str, words: str
) -> None:
    async with running_engine() as engine:
        with pytest.raises(InvalidInput, match=words) as caught:
            await engine.submit(constrained(schema))
    assert caught.value.param == param


async def test_min_tokens_with_a_grammar_is_refused() -> None:
    async with running_engine() as engine:
        with pytest.raises(InvalidInput, match="min_tokens") as caught:
            await engine.submit(constrained(NAMED, min_tokens=3))
    assert caught.value.param == "min_tokens"


def test_a_schema_compiles_once() -> None:
    """The second request with the same schema takes the cached matcher; states are separate."""
    compiler = GrammarCompiler(AsciiCodec(), PagedEcho().vocab_size)
    grammar = OutputGrammar(GrammarKind.JSON_SCHEMA, json.dumps(NAMED))
    compiled: list[object] = []
    compile_ = compiler._compile

    def counting(g: OutputGrammar) -> Any:
        compiled.append(g)
        return compile_(g)

    compiler._compile = counting  # type: ignore[method-assign,assignment]
    first, second = compiler.states(grammar, 2)
    (third,) = compiler.states(grammar, 1)
    assert len(compiled) == 1
    first.advance(ord("{"))
    assert not second.ended
    assert not third.ended
    second.advance(ord("{"))  # its own position: the first one's token did not move it


def test_a_word_vocabulary_is_read_from_its_decoded_tokens() -> None:
    """The synthetic model's words: a Lark grammar of three words allows exactly them in turn."""
    codec = SyntheticCodec(64)
    compiler = GrammarCompiler(codec, codec.vocab_size)
    (state,) = compiler.states(OutputGrammar(GrammarKind.LARK, 'start: "river" "stone"'), 1)
    words = {codec.word(i): i for i in range(2, 66)}
    state.advance(words["river"])
    with pytest.raises(RuntimeError, match="breaks the output grammar"):
        state.advance(words["light"])


def test_smollm2_vocabulary_masks_random_logits_into_the_schema(
    smollm2_checkpoint: Checkpoint,
) -> None:
    """SmolLM2's byte-level BPE vocabulary (the `tokenizers` path) holds random logits to JSON.

    A batch of rows drawn greedily from noise under the mask decodes, every row, to JSON the
    schema validates.
    """
    codec = smollm2_checkpoint.codec
    vocab = smollm2_checkpoint.config.vocab_size
    grammar = OutputGrammar(GrammarKind.JSON_SCHEMA, json.dumps(NAMED))
    states = GrammarCompiler(codec, vocab).states(grammar, 4)
    generator = torch.Generator().manual_seed(0)
    tokens: list[list[int]] = [[] for _ in states]
    for _ in range(64):
        live = [n for n, state in enumerate(states) if not state.ended]
        if not live:
            break
        logits = torch.randn(len(live), vocab, generator=generator)
        picked = mask_logits(logits, range(len(live)), [states[n] for n in live]).argmax(-1)
        for n, token in zip(live, picked.tolist(), strict=True):
            states[n].advance(token)
            tokens[n].append(token)
    assert all(state.ended for state in states)
    for ids in tokens:
        text = codec.decode([t for t in ids if t not in codec.eos_token_ids])
        jsonschema.validate(json.loads(text), NAMED)
