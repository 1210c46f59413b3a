"""The semantic cache's adapter in process: what must match besides the prompt's meaning.

A fake runtime serves the synthetic generative model's tokenizer and counts generations;
the encoder is the real MiniLM. A salted request shares answers only with its salt, a chat
only with chats of the same earlier messages, token-id prompts only with exact repeats, and
an answer generated while another load took the version's place is not stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from fleetserve_runtime.core.config_sections import SemanticCacheConfig
from fleetserve_runtime.generate.contracts import (
    FinishEvent,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
    Usage,
)
from fleetserve_runtime.models.base import ModelHandler
from fleetserve_runtime.models.causal_lm import ChatMessage
from fleetserve_runtime.models.generative import GenerativeOptions, synthetic_generative_handler
from fleetserve_runtime.models.registry import KVFigures, LoadedModel
from fleetserve_runtime.models.synthetic_lm import SyntheticGenerativeParams
from fleetserve_runtime.server.openai_cache import SemanticAnswers

QUESTION = "What is the capital of France?"


class _Stream:
    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def prompt_tokens(self) -> int:
        return 3

    async def __aiter__(self) -> AsyncIterator[GenerationEvent]:
        yield TokenEvent(self.text)
        yield FinishEvent(FinishReason.STOP, Usage(3, 1))

    async def aclose(self) -> None:
        pass


class _Metrics:
    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def observe_semantic_cache(self, version: str, outcome: str) -> None:
        self.outcomes.append(outcome)


class FakeRuntime:
    """What the adapter asks of the runtime: the active load, generations and the metric."""

    def __init__(self, current: LoadedModel) -> None:
        self.current = current
        self.metrics = _Metrics()
        self.generated = 0

    def model(self, version: str | None) -> LoadedModel:
        """The current load."""
        return self.current

    async def generate(self, request: GenerationRequest) -> _Stream:
        """A stream of the next numbered answer."""
        self.generated += 1
        return _Stream(f"answer {self.generated}")


def loaded(generation: int) -> LoadedModel:
    handler = synthetic_generative_handler(
        "m", "v1", params=SyntheticGenerativeParams(), options=GenerativeOptions()
    )
    handler.load(torch.device("cpu"))
    kv = KVFigures(num_blocks=64, block_size=16, block_bytes=1, activation_bytes=0)
    return LoadedModel(handler, 0.0, None, 0, generation=generation, kv=kv)


CONFIG = SemanticCacheConfig(encoder="builtin://minilm-l6", max_entries=64)


def semantic_answers() -> SemanticAnswers:
    return SemanticAnswers(CONFIG, model="m", default_max_tokens=8)


@pytest.fixture(scope="module")
def encoder() -> ModelHandler:
    """MiniLM, loaded once for the module (the tests share it, not its cache)."""
    return semantic_answers()._load_encoder()


@pytest.fixture
def answers(encoder: ModelHandler) -> SemanticAnswers:
    """An empty cache over the module's encoder."""
    fresh = semantic_answers()
    fresh._encoder = encoder
    return fresh


def completion(prompt: str | None = QUESTION, **fields: object) -> GenerationRequest:
    ids = fields.pop("ids", None)
    return GenerationRequest(
        SamplingParams(max_tokens=4, temperature=0.0),
        prompt=None if ids is not None else prompt,
        prompt_token_ids=ids,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


def chat(system: str, user: str) -> GenerationRequest:
    messages = (ChatMessage("system", system), ChatMessage("user", user))
    return GenerationRequest(SamplingParams(max_tokens=4, temperature=0.0), messages=messages)


async def text_of(answers: SemanticAnswers, rt: FakeRuntime, request: GenerationRequest) -> str:
    stream = await answers.generate(rt, request, tenant=None)  # type: ignore[arg-type]
    texts = [event.text async for event in stream if isinstance(event, TokenEvent)]
    return "".join(texts)


async def test_a_salted_request_shares_answers_only_with_its_salt(
    answers: SemanticAnswers,
) -> None:
    rt = FakeRuntime(loaded(1))
    assert await text_of(answers, rt, completion(cache_salt="a")) == "answer 1"
    assert await text_of(answers, rt, completion(cache_salt="b")) == "answer 2"
    assert await text_of(answers, rt, completion()) == "answer 3"
    assert await text_of(answers, rt, completion(cache_salt="a")) == "answer 1"
    assert rt.metrics.outcomes == ["miss", "miss", "miss", "exact_hit"]


async def test_a_chat_matches_only_chats_with_the_same_earlier_messages(
    answers: SemanticAnswers,
) -> None:
    rt = FakeRuntime(loaded(1))
    assert await text_of(answers, rt, chat("Answer in French.", QUESTION)) == "answer 1"
    assert await text_of(answers, rt, chat("Answer in English.", QUESTION)) == "answer 2"
    paraphrase = chat("Answer in French.", "What is France's capital?")
    assert await text_of(answers, rt, paraphrase) == "answer 1"
    assert rt.metrics.outcomes == ["miss", "miss", "semantic_hit"]


async def test_token_id_prompts_hit_exact_repeats_only(answers: SemanticAnswers) -> None:
    rt = FakeRuntime(loaded(1))
    assert await text_of(answers, rt, completion(ids=(5, 6, 7))) == "answer 1"
    assert await text_of(answers, rt, completion(ids=(5, 6, 8))) == "answer 2"
    assert await text_of(answers, rt, completion(ids=(5, 6, 7))) == "answer 1"
    assert rt.metrics.outcomes == ["miss", "miss", "exact_hit"]


async def test_an_answer_generated_after_a_swap_is_not_stored(
    answers: SemanticAnswers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Load 2 takes load 1's place while the prompt is embedded: the answer is not stored.

    Stored under load 1's key, it would be served for load 1's answer once load 1 is
    active again.
    """
    first, second = loaded(1), loaded(2)
    rt = FakeRuntime(first)
    embed = answers._embed

    async def embed_then_swap(text: str) -> npt.NDArray[np.float32]:
        embedding = await embed(text)
        rt.current = second
        return embedding

    monkeypatch.setattr(answers, "_embed", embed_then_swap)
    assert await text_of(answers, rt, completion()) == "answer 1"
    monkeypatch.setattr(answers, "_embed", embed)
    rt.current = first  # switched back
    assert await text_of(answers, rt, completion()) == "answer 2"
    assert rt.metrics.outcomes == ["miss", "miss"]


async def test_sampled_requests_bypass(answers: SemanticAnswers) -> None:
    rt = FakeRuntime(loaded(1))
    sampled = GenerationRequest(SamplingParams(max_tokens=4, temperature=0.7), prompt=QUESTION)
    assert await text_of(answers, rt, sampled) == "answer 1"
    assert await text_of(answers, rt, sampled) == "answer 2"
    assert rt.metrics.outcomes == ["bypass", "bypass"]


def greedy(n: int = 1, **asks: Any) -> GenerationRequest:
    """A greedy request for `QUESTION` with `asks` set on its sampling."""
    return GenerationRequest(
        SamplingParams(max_tokens=4, temperature=0.0, **asks), prompt=QUESTION, n=n
    )


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(greedy(n=2), id="n"),
        pytest.param(greedy(logprobs=0), id="logprobs"),
        pytest.param(greedy(prompt_logprobs=0, echo=True), id="echo"),
        pytest.param(greedy(logit_bias=((3, 5.0),)), id="logit_bias"),
        pytest.param(greedy(frequency_penalty=1.0), id="penalty"),
        pytest.param(greedy(min_tokens=2), id="min_tokens"),
        pytest.param(greedy(stop_token_ids=(3,)), id="stop_token_ids"),
    ],
)
async def test_greedy_requests_asking_for_more_than_plain_text_bypass(
    answers: SemanticAnswers, request_: GenerationRequest
) -> None:
    """A request asking for more than one plain greedy text generates, each time.

    A cached answer is one choice of it, without log-probabilities or an echoed prompt.
    """
    rt = FakeRuntime(loaded(1))
    assert await text_of(answers, rt, completion()) == "answer 1"
    assert await text_of(answers, rt, request_) == "answer 2"
    assert await text_of(answers, rt, request_) == "answer 3"
    assert rt.metrics.outcomes == ["miss", "bypass", "bypass"]
