"""Malformed and oversized bodies on the generation routes: cheap refusals, never a 5xx.

In process (ASGI transport, real lifespan, synthetic LLM). Nesting is bounded before any
schema walks a body; a prompt that cannot fit the context is refused before it is
tokenised (or, as token ids, converted): spies on the tokenizer and the schema prove it.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fleetserve_runtime.server.generation as generation
from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.core.json_limits import MAX_JSON_DEPTH, check_depth
from fleetserve_runtime.models.synthetic_lm import SyntheticCodec
from fleetserve_runtime.testing import error_message
from fleetserve_runtime.testing.asgi import serve

CONTEXT = 8192
LLM = f"builtin://synthetic-generate?per_token_ms=0&output_tokens=4&context_length={CONTEXT}"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/v2/models/test/generate"
JSON = {"content-type": "application/json"}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def counted(metrics: str) -> dict[str, float]:
    """`fleetserve_requests_total` by status code, the codes counted at least once."""
    return {
        sample.labels["code"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "fleetserve_requests_total" and sample.value
    }


# -- nesting ------------------------------------------------------------------------------


def test_check_depth_counts_arrays_and_objects() -> None:
    check_depth({"a": [{"b": [1]}]}, limit=4)
    check_depth(nested(MAX_JSON_DEPTH))
    with pytest.raises(InvalidInput, match="deeper than 3 levels"):
        check_depth({"a": [{"b": [1]}]}, limit=3)
    with pytest.raises(InvalidInput, match=f"deeper than {MAX_JSON_DEPTH} levels"):
        check_depth(nested(MAX_JSON_DEPTH + 1))


DEEP = b"[" * 900 + b"1" + b"]" * 900
"""About 2 KB of JSON: parses (orjson allows 1024 levels), but `repr` of it recurses too far
(orjson writes at most 255 levels, hence bytes)."""


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(
            CHAT,
            b'{"model": "test", "messages": [{"role": "user", "content": "x"}], "tools": [%s]}',
            id="chat-tools",
        ),
        pytest.param(COMPLETIONS, b'{"model": "test", "prompt": "x", "suffix": %s}', id="suffix"),
        pytest.param(GENERATE, b'{"text_input": "x", "parameters": {"stop": %s}}', id="generate"),
    ],
)
async def test_deeply_nested_bodies_are_a_400_naming_the_limit(path: str, body: bytes) -> None:
    """Refused before the schema sees them, and counted as the client's fault, not a 5xx."""
    raw = body % DEEP
    assert len(raw) < 4096
    async with serve(LLM) as (client, _):
        response = await client.post(path, content=raw, headers=JSON)
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 400, response.text
    assert f"deeper than {MAX_JSON_DEPTH} levels" in error_message(response.json())
    assert counted(metrics) == {"400": 1.0}


async def test_no_malformed_body_is_counted_as_a_server_error() -> None:
    """A run of malformed bodies on every generation route: each a 4xx in the metrics."""
    bodies: list[bytes] = [
        b"",
        b"{",
        b"\xff\xfe",
        b"[]",
        b'"text"',
        b'{"model": "test", "messages": "not a list"}',
        b'{"model": "test", "messages": [{"role": "user", "content": [1, [2]]}]}',
        b'{"model": "test", "messages": [{"role": "user", "content": [{"type": "text"}]}]}',
        b'{"model": "test", "prompt": [[1, 2], "x"]}',
        b'{"model": "test", "prompt": [1, -2]}',
        b'{"model": "test", "prompt": []}',
        b'{"model": "test", "prompt": "x", "logit_bias": {"1": "a"}}',
        b'{"text_input": "x", "parameters": [1]}',
        b'{"model": "test", "prompt": "x", "tool": %s}' % DEEP,
    ]
    async with serve(LLM) as (client, _):
        for path in (CHAT, COMPLETIONS, GENERATE):
            for raw in bodies:
                response = await client.post(path, content=raw, headers=JSON)
                assert 400 <= response.status_code < 500, (path, raw[:60], response.text)
        metrics = (await client.get("/metrics")).text
    codes = counted(metrics)
    assert sum(codes.values()) == 3 * len(bodies)
    assert all(code.startswith("4") for code in codes), codes


# -- prompts that cannot fit -------------------------------------------------------------


@pytest.fixture
def tokenised(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the synthetic tokenizer (or its chat template) is asked to process.

    The runtime's load-time check generates once; tests clear the list once the server is up.
    """
    seen: list[str] = []
    encode, render = SyntheticCodec.encode, SyntheticCodec.render_chat

    def spy_encode(self: SyntheticCodec, text: str, *, add_special: bool) -> list[int]:
        seen.append(text)
        return encode(self, text, add_special=add_special)

    def spy_render(self: SyntheticCodec, messages: Any) -> str:
        seen.append("<chat>")
        return render(self, messages)

    monkeypatch.setattr(SyntheticCodec, "encode", spy_encode)
    monkeypatch.setattr(SyntheticCodec, "render_chat", spy_render)
    return seen


EMOJI = "\U0001f600" * (2 * 1024 * 1024 // 4)
"""2 MB of 4-byte characters: few enough characters to pass a per-character bound, far more
bytes than the context's tokens can stand for."""


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(CHAT, {"model": "test", "messages": [{"role": "user", "content": EMOJI}]}),
        pytest.param(COMPLETIONS, {"model": "test", "prompt": EMOJI}),
        pytest.param(GENERATE, {"text_input": EMOJI}),
    ],
    ids=["chat", "completions", "generate"],
)
async def test_a_text_too_many_bytes_for_the_context_is_refused_before_tokenising(
    tokenised: list[str], path: str, body: dict[str, Any]
) -> None:
    async with serve(LLM) as (client, _):
        tokenised.clear()
        response = await client.post(path, content=orjson.dumps(body), headers=JSON)
    assert response.status_code == 400, response.text[:300]
    assert f"cannot fit the model's context of {CONTEXT} tokens" in error_message(response.json())
    assert "bytes" in error_message(response.json())
    assert tokenised == []


async def test_a_token_id_prompt_longer_than_the_context_is_refused_before_conversion(
    tokenised: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not validated into the schema or the engine's tuple, and never tokenised."""
    validated: list[type] = []
    validate = generation.validate_body

    def spy(data: Any, model: type[Any]) -> Any:
        validated.append(model)
        return validate(data, model)

    monkeypatch.setattr(generation, "validate_body", spy)
    async with serve(LLM) as (client, _):
        tokenised.clear()  # the warm-up, if any
        for prompt in ([7] * (CONTEXT + 1), [[7] * (CONTEXT + 1)]):
            response = await client.post(COMPLETIONS, json={"model": "test", "prompt": prompt})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
            assert f"{CONTEXT + 1} token ids" in error["message"]
        fits = await client.post(COMPLETIONS, json={"model": "test", "prompt": [7] * 8})
    assert fits.status_code == 200, fits.text
    assert validated.count(generation.CompletionRequest) == 1
    assert tokenised == []
