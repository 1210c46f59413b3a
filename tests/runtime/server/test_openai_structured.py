"""Structured output through the official `openai` client, over loopback.

The server runs the synthetic model with printable-ASCII output tokens: its own choice of
character is a hash, so free it writes noise, and held to a grammar it writes whatever the
mask leaves (a real model is too slow to start on a loaded test machine). Fifty sampled
answers to a JSON schema (whole and streamed, `n` choices each) all parse and validate; JSON
mode answers objects; a schema the server cannot enforce is a 400 naming `response_format`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest

from tests.runtime.server.test_openai_client import client, running

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "round": {"type": "boolean"},
    },
    "required": ["colour", "count", "round"],
    "additionalProperties": False,
}
RESPONSE_FORMAT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
}
MESSAGES: Any = [{"role": "user", "content": "Describe a ball as JSON: its colour, count, shape."}]
CHOICES = 10
"""Choices per request: five requests make the fifty answers."""


LLM = "builtin://synthetic-generate?per_token_ms=1&output=ascii&vocab=95&context_length=512"


@pytest.fixture(scope="module")
def api() -> Iterator[openai.OpenAI]:
    with running(LLM, ready_s=100) as url, client(url) as api:
        yield api


def test_fifty_sampled_answers_validate_against_the_schema(api: openai.OpenAI) -> None:
    answers: list[str] = []
    ask: dict[str, Any] = {
        "model": "test",
        "messages": MESSAGES,
        "response_format": RESPONSE_FORMAT,
        "n": CHOICES,
        "temperature": 1.0,
        "max_tokens": 64,
    }
    for seed in range(3):
        whole = api.chat.completions.create(**ask, seed=seed)
        for choice in whole.choices:
            assert choice.finish_reason == "stop"
            answers.append(choice.message.content or "")
    for seed in range(3, 5):
        texts = [""] * CHOICES
        reasons: list[str | None] = [None] * CHOICES
        for chunk in api.chat.completions.create(**ask, seed=seed, stream=True):
            for streamed in chunk.choices:
                texts[streamed.index] += streamed.delta.content or ""
                reasons[streamed.index] = streamed.finish_reason or reasons[streamed.index]
        assert reasons == ["stop"] * CHOICES
        answers.extend(texts)
    assert len(answers) == 50
    for answer in answers:
        jsonschema.validate(json.loads(answer), SCHEMA)
    assert len(set(answers)) > 1  # sampled, not one answer fifty times


def test_json_mode_answers_objects(api: openai.OpenAI) -> None:
    """Every answer that ends is one JSON object; one cut by `max_tokens` is the start of one."""
    answer = api.chat.completions.create(
        model="test",
        messages=MESSAGES,
        response_format={"type": "json_object"},
        n=CHOICES,
        temperature=1.0,
        seed=0,
        max_tokens=120,
    )
    ended = [c.message.content or "" for c in answer.choices if c.finish_reason == "stop"]
    assert ended
    for text in ended:
        assert isinstance(json.loads(text), dict)
    assert all((c.message.content or "").startswith("{") for c in answer.choices)


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["a" * 40_000]}}},
        {"type": "json_schema"},
        {"type": "xml"},
    ],
    ids=["unsupported", "too-large", "no-schema", "unknown-type"],
)
def test_a_format_that_cannot_be_enforced_is_a_400_naming_it(
    api: openai.OpenAI, response_format: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="test", messages=MESSAGES, response_format=response_format, max_tokens=8
        )
    assert caught.value.param is not None
    assert caught.value.param.startswith("response_format")
