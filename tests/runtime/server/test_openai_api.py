"""The OpenAI-compatible routes in process (ASGI transport, real lifespan, synthetic LLM).

Shapes as OpenAI's, streamed and whole; every refusal OpenAI-shaped with the field it names
and the status clients expect (400 for a prompt over the context, 404, 503 + Retry-After,
504); errors inside a stream as an error event, then `[DONE]`; every answer counted in the
request metrics.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest

from fleetserve_runtime.core.config_sections import GenerationConfig
from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.generate.contracts import SamplingParams
from fleetserve_runtime.models.causal_lm import ChatMessage
from fleetserve_runtime.server.generation_schemas import RequestControls
from fleetserve_runtime.server.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_generation,
    completion_generation,
)
from fleetserve_runtime.testing import metric_total
from fleetserve_runtime.testing.asgi import serve
from tests.runtime.server.openai_testing import (
    CHAT,
    LLM,
    SLOW_LLM,
    TOKEN,
    assert_openai_error,
    chat,
    events,
)


async def test_chat_completion_has_openai_shape_and_usage() -> None:
    """A whole chat completion: one assistant message, finish reason, usage that adds up."""
    async with serve(LLM) as (client, _):
        response = await client.post(CHAT, json=chat(), headers={"x-request-id": "abc-1"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == "chatcmpl-abc-1"
    assert body["object"] == "chat.completion"
    assert body["model"] == "test"
    assert isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].strip()
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_chat_stream_is_openai_chunks_ending_with_done() -> None:
    """Role first, then content deltas that add up to the whole answer; usage last; [DONE]."""
    async with serve(LLM) as (client, _):
        whole = (await client.post(CHAT, json=chat(temperature=0))).json()
        response = await client.post(CHAT, json=chat(temperature=0, stream=True))
    assert response.status_code == 200
    payloads = events(response)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == whole["usage"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(CHAT, chat(), id="chat"),
        pytest.param("/v1/completions", {"model": "test", "prompt": "x y z"}, id="completions"),
    ],
)
async def test_stream_include_usage_adds_a_usage_only_chunk(
    path: str, body: dict[str, Any]
) -> None:
    """With `stream_options.include_usage`, usage comes in a last chunk with no choices.

    As OpenAI's, every chunk before it says `"usage": null`.
    """
    async with serve(LLM) as (client, _):
        response = await client.post(
            path, json={**body, "stream": True, "stream_options": {"include_usage": True}}
        )
    *chunks, done = events(response)
    assert done == "[DONE]"
    finish, usage_only = chunks[-2], chunks[-1]
    assert finish["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert usage_only["choices"] == []
    usage = usage_only["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] >= len(chunks) - 3  # role and finish chunks carry no text


async def test_completions_whole_and_streamed() -> None:
    """Legacy completions: `text_completion` objects; `max_tokens` ends with "length"."""
    body = {"model": "test", "prompt": "once upon a time", "max_tokens": 5, "temperature": 0}
    async with serve(LLM) as (client, _):
        whole = (await client.post("/v1/completions", json=body)).json()
        streamed = await client.post("/v1/completions", json={**body, "stream": True})
    assert whole["object"] == "text_completion"
    assert whole["id"].startswith("cmpl-")
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 5
    *chunks, done = events(streamed)
    assert done == "[DONE]"
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == whole["usage"]


async def test_stop_string_is_cut_from_the_answer() -> None:
    """The answer ends right before the first stop string, which it does not contain."""
    async with serve(LLM) as (client, _):
        free = (await client.post(CHAT, json=chat(temperature=0))).json()
        words = free["choices"][0]["message"]["content"].split()
        stop = " " + words[3]
        stopped = (await client.post(CHAT, json=chat(temperature=0, stop=[stop]))).json()
    text = free["choices"][0]["message"]["content"]
    assert stopped["choices"][0]["message"]["content"] == text[: text.index(stop)]
    assert stopped["choices"][0]["finish_reason"] == "stop"


async def test_unknown_model_is_404_and_models_lists_the_served_one() -> None:
    """`model` must be the served name; `/v1/models` lists it, OpenAI-style."""
    async with serve(LLM) as (client, _):
        response = await client.post(CHAT, json={**chat(), "model": "gpt-4"})
        listing = (await client.get("/v1/models")).json()
        card = await client.get("/v1/models/test")
        other = await client.get("/v1/models/gpt-4")
    assert assert_openai_error(response, 404, None)["type"] == "not_found_error"
    assert listing["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in listing["data"]] == [
        ("test", "model", "fleetserve")
    ]
    assert card.json()["id"] == "test"
    assert_openai_error(other, 404, None)


async def test_errors_before_the_route_are_openai_shaped_there() -> None:
    """Bad token, wrong method, bad media type, malformed JSON: OpenAI's shape on /v1 paths."""
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(TOKEN)
        async with serve(LLM, auth_token_file=token_file, max_body_bytes=2048) as (client, _):
            no_token = await client.post(CHAT, json=chat())
            auth = {"authorization": f"Bearer {TOKEN}"}
            ok = await client.post(CHAT, json=chat(), headers=auth)
            method = await client.get(CHAT, headers=auth)
            media = await client.post(CHAT, content=b"{}", headers=auth)
            malformed = await client.post(
                CHAT, content=b"{", headers={**auth, "content-type": "application/json"}
            )
            large = await client.post(CHAT, json=chat("x" * 4096), headers=auth)
            oip = await client.post("/v2/models/test/generate", json={"text_input": "a"})
    assert assert_openai_error(no_token, 401, None)["type"] == "authentication_error"
    assert no_token.headers["www-authenticate"].startswith("Bearer")
    assert ok.status_code == 200
    assert_openai_error(method, 405, None)
    assert_openai_error(media, 415, None)
    assert_openai_error(malformed, 400, None)
    assert_openai_error(large, 413, None)
    assert oip.status_code == 401
    assert isinstance(oip.json()["error"], str)


async def test_requests_are_counted_by_status() -> None:
    """Generation answers count in `fleetserve_requests_total` like inference ones."""
    async with serve(LLM) as (client, _):
        await client.post(CHAT, json=chat())
        await client.post(CHAT, json=chat(stream=True))
        await client.post(CHAT, json=chat(n=17))
        await client.post(CHAT, json={**chat(), "model": "other"})
        metrics = (await client.get("/metrics")).text
    assert metric_total(metrics, "fleetserve_requests_total", code="200") == 2
    assert metric_total(metrics, "fleetserve_requests_total", code="400") == 1
    assert metric_total(metrics, "fleetserve_requests_total", code="404") == 1


async def test_full_queue_is_503_with_retry_after() -> None:
    """Beyond the waiting queue's bound: 503, OpenAI-shaped, with `Retry-After`."""
    async with serve(
        SLOW_LLM,
        max_instances=1,
        queue={"max_queue_size": 1, "retry_after_s": 2},
        generation={"max_running_sequences": 1, "max_step_tokens": 64},
    ) as (client, _):
        responses = await asyncio.gather(*(client.post(CHAT, json=chat()) for _ in range(4)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses[0] == 200
    assert statuses[-1] == 503
    refused = next(r for r in responses if r.status_code == 503)
    assert refused.headers["retry-after"] == "2"
    assert assert_openai_error(refused, 503, None)["code"] == "queue_full"


async def test_deadline_before_the_first_token_is_504() -> None:
    """A request whose deadline passes in the queue gets a plain 504, also when streaming."""
    async with serve(SLOW_LLM, generation={"max_running_sequences": 1, "max_step_tokens": 64}) as (
        client,
        _,
    ):
        busy = asyncio.ensure_future(client.post(CHAT, json=chat()))
        await asyncio.sleep(0.1)
        late = await client.post(
            CHAT, json=chat(stream=True), headers={"x-fleetserve-timeout-ms": "100"}
        )
        await busy
        metrics = (await client.get("/metrics")).text
    assert assert_openai_error(late, 504, None)["code"] == "deadline_exceeded"
    assert metric_total(metrics, "fleetserve_requests_total", code="504") == 1


async def test_error_inside_a_stream_is_an_error_event_then_done() -> None:
    """A deadline passing mid-stream ends it with an error event and [DONE], counted as 504."""
    async with serve(SLOW_LLM) as (client, _):
        response = await client.post(
            CHAT, json=chat(stream=True), headers={"x-fleetserve-timeout-ms": "300"}
        )
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 200
    payloads = events(response)
    assert payloads[-1] == "[DONE]"
    assert any(p["choices"] and p["choices"][0]["delta"].get("content") for p in payloads[:-2])
    error = payloads[-2]["error"]
    assert error["type"] == "server_error"
    assert error["code"] == "deadline_exceeded"
    assert metric_total(metrics, "fleetserve_requests_total", code="504") == 1


async def test_a_failing_model_step_is_a_500_event_in_the_stream() -> None:
    """A model step that raises fails the stream with a server error event (no traceback)."""
    async with serve(f"{LLM}&error_rate=1") as (client, _):
        streamed = await client.post(CHAT, json=chat(stream=True))
        whole = await client.post(CHAT, json=chat())
    payloads = events(streamed)
    assert payloads[-1] == "[DONE]"
    assert payloads[-2]["error"]["type"] == "server_error"
    assert "Traceback" not in streamed.text
    assert_openai_error(whole, 500, None)


async def test_encoder_model_refuses_chat_and_lists_no_model() -> None:
    """An embedding model has no chat: 400 saying so; `/v1/models` lists nothing."""
    async with serve("builtin://synthetic?latency_ms=0&per_item_ms=0") as (client, _):
        response = await client.post(CHAT, json=chat())
        listing = (await client.get("/v1/models")).json()
    assert "embeddings" in assert_openai_error(response, 400, None)["message"]
    assert listing["data"] == []


async def test_infer_on_a_generative_model_names_the_generate_endpoints() -> None:
    """The encoder route on an LLM is a 400 that says where to go instead."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    async with serve(LLM) as (client, _):
        response = await client.post("/v2/models/test/infer", json=body)
    assert response.status_code == 400
    assert "/v1/chat/completions" in response.json()["error"]


# -- the translation to the engine's request, pure ---------------------------------------

CONTROLS = RequestControls(priority=Priority.HIGH, timeout_s=2.5, request_id="r-9")
LIMITS = GenerationConfig()


def test_chat_translation_maps_roles_parts_and_limits() -> None:
    """`developer` is a system message, text parts join by newlines, and token limits apply."""
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 7,
            "stop": "END",
            "seed": -5,
            "top_k": -1,
        }
    )
    generation = chat_generation(body, controls=CONTROLS, limits=LIMITS)
    assert generation.messages == (ChatMessage("system", "be brief"), ChatMessage("user", "a\nb"))
    assert generation.sampling == SamplingParams(max_tokens=7, stop=("END",), seed=-5)
    assert (generation.priority, generation.timeout_s, generation.request_id) == (
        Priority.HIGH, 2.5, "r-9",
    )  # fmt: skip
    unset = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert chat_generation(unset, controls=CONTROLS, limits=LIMITS).sampling.max_tokens is None


def test_chat_translation_refuses_both_token_limits() -> None:
    """`max_tokens` and `max_completion_tokens` together are ambiguous: 400 naming one."""
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
            "max_completion_tokens": 4,
        }
    )
    with pytest.raises(InvalidInput) as caught:
        chat_generation(body, controls=CONTROLS, limits=LIMITS)
    assert caught.value.param == "max_completion_tokens"


@pytest.mark.parametrize(
    ("prompt", "text", "ids"),
    [
        pytest.param("hello", "hello", None, id="text"),
        pytest.param(["hello"], "hello", None, id="one-text"),
        pytest.param([5, 6, 7], None, (5, 6, 7), id="token-ids"),
        pytest.param([[5, 6]], None, (5, 6), id="one-token-list"),
    ],
)
def test_completion_prompt_forms(
    prompt: Any, text: str | None, ids: tuple[int, ...] | None
) -> None:
    """A completion prompt is one text or one list of token ids; `max_tokens` defaults to 16."""
    body = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    generation = completion_generation(body, controls=CONTROLS, limits=LIMITS)
    assert (generation.prompt, generation.prompt_token_ids) == (text, ids)
    assert generation.sampling.max_tokens == 16


@pytest.mark.parametrize("prompt", [["a", "b"], [[1], [2]], []], ids=["texts", "id-lists", "empty"])
def test_completion_refuses_batched_or_empty_prompts(prompt: Any) -> None:
    """One prompt per request: a batch of prompts (or none) is a 400 naming `prompt`."""
    body = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    with pytest.raises(InvalidInput) as caught:
        completion_generation(body, controls=CONTROLS, limits=LIMITS)
    assert caught.value.param == "prompt"


COMPLETION_INVALID = [
    pytest.param({"logprobs": 6}, "logprobs", id="logprobs-over-5"),
    pytest.param({"logprobs": -1}, "logprobs", id="logprobs-negative"),
    pytest.param({"logprobs": True}, "logprobs", id="logprobs-bool"),
    pytest.param({"max_tokens": 0}, "max_tokens", id="max-tokens-0-without-echo"),
    pytest.param({"max_tokens": -1, "echo": True}, "max_tokens", id="max-tokens-negative"),
    pytest.param({"echo": 2}, "echo", id="echo-not-bool"),
]


@pytest.mark.parametrize(("fields", "param"), COMPLETION_INVALID)
async def test_completion_logprobs_and_echo_are_bounded(fields: dict[str, Any], param: str) -> None:
    """`logprobs` 0..5 (an int), `max_tokens` 0 only with `echo`: 400 naming the key."""
    async with serve(LLM) as (client, _):
        response = await client.post(
            "/v1/completions", json={"model": "test", "prompt": "x", **fields}
        )
    assert_openai_error(response, 400, param)


def chat_entries(payloads: list[Any]) -> list[Any]:
    """The `logprobs.content` entries of a chat stream's chunks, in order."""
    return [
        entry
        for chunk in payloads
        if isinstance(chunk, dict) and chunk.get("choices") and chunk["choices"][0]["logprobs"]
        for entry in chunk["choices"][0]["logprobs"]["content"]
    ]


async def test_chat_logprobs_whole_and_streamed_are_the_same_entries() -> None:
    """Each token: text, logprob, UTF-8 bytes, `top_logprobs` as asked, most likely first."""
    body = chat(temperature=0, logprobs=True, top_logprobs=3)
    async with serve(LLM) as (client, _):
        whole = (await client.post(CHAT, json=body)).json()
        streamed = events(await client.post(CHAT, json={**body, "stream": True}))
        plain = (await client.post(CHAT, json=chat(temperature=0))).json()
    [choice] = whole["choices"]
    content = choice["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3
        values = [top["logprob"] for top in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True)
        assert entry["logprob"] == values[0]  # greedy
    assert chat_entries(streamed) == content
    assert plain["choices"][0]["logprobs"] is None


async def test_completion_echo_with_logprobs_whole_and_streamed() -> None:
    """The prompt first (its first token unscored), then the completion; offsets add up."""
    body = {"model": "test", "prompt": "alpha beta", "max_tokens": 4, "temperature": 0}
    async with serve(LLM) as (client, _):
        whole = await client.post("/v1/completions", json={**body, "echo": True, "logprobs": 2})
        streamed = events(
            await client.post(
                "/v1/completions", json={**body, "echo": True, "logprobs": 2, "stream": True}
            )
        )
        plain = (await client.post("/v1/completions", json=body)).json()
        alone = await client.post(
            "/v1/completions", json={**body, "echo": True, "logprobs": 1, "max_tokens": 0}
        )
    [choice] = whole.json()["choices"]
    completion = plain["choices"][0]["text"]
    assert choice["text"] == "alpha beta" + completion
    logprobs = choice["logprobs"]
    usage = whole.json()["usage"]
    assert len(logprobs["tokens"]) == usage["prompt_tokens"] + usage["completion_tokens"]
    assert logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None
    assert all(isinstance(value, float) for value in logprobs["token_logprobs"][1:])
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    for token, value, top in zip(
        logprobs["tokens"][1:],
        logprobs["token_logprobs"][1:],
        logprobs["top_logprobs"][1:],
        strict=True,
    ):
        assert top[token] == value  # the chosen token is always listed
        assert len(top) <= 3
    chunks = [c for c in streamed if isinstance(c, dict) and c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    merged: dict[str, list[Any]] = {key: [] for key in logprobs}
    for chunk in chunks:
        for key, values in (chunk["choices"][0]["logprobs"] or {}).items():
            merged[key].extend(values)
    assert merged == logprobs
    assert plain["choices"][0]["logprobs"] is None
    [only] = alone.json()["choices"]
    assert only["text"] == "alpha beta"
    assert only["finish_reason"] == "length"
    assert only["logprobs"]["tokens"] == logprobs["tokens"][: usage["prompt_tokens"]]
    assert alone.json()["usage"]["completion_tokens"] == 0


async def test_completion_echo_with_logprobs_and_n_echoes_each_choice() -> None:
    """`n=2` with `echo` and `logprobs`: each choice is the one-choice answer, prompt first.

    As vLLM answers: every choice starts with the prompt and its scores; streamed, each
    choice's chunks (told apart by `index`) carry its own text and offsets, from 0. With
    `max_tokens` 0, each choice is the prompt alone.
    """
    body = {"model": "test", "prompt": "alpha beta", "max_tokens": 4, "temperature": 0}
    asks = {**body, "echo": True, "logprobs": 2}
    async with serve(LLM) as (client, _):
        one = (await client.post("/v1/completions", json=asks)).json()
        whole = (await client.post("/v1/completions", json={**asks, "n": 2})).json()
        streamed = events(
            await client.post("/v1/completions", json={**asks, "n": 2, "stream": True})
        )
        alone = (
            await client.post("/v1/completions", json={**asks, "n": 2, "max_tokens": 0})
        ).json()
    [single] = one["choices"]
    assert [choice["index"] for choice in whole["choices"]] == [0, 1]
    for choice in whole["choices"]:
        assert choice["text"] == single["text"]
        assert choice["text"].startswith("alpha beta")
        assert choice["logprobs"] == single["logprobs"]
    merged: dict[int, dict[str, list[Any]]] = {}
    texts: dict[int, str] = {}
    for chunk in streamed:
        if not isinstance(chunk, dict):
            continue
        for part in chunk["choices"]:
            texts[part["index"]] = texts.get(part["index"], "") + part["text"]
            mine = merged.setdefault(part["index"], {key: [] for key in single["logprobs"]})
            for key, values in (part["logprobs"] or {}).items():
                mine[key].extend(values)
    assert texts == {0: single["text"], 1: single["text"]}
    assert merged == {0: single["logprobs"], 1: single["logprobs"]}
    prompt_tokens = one["usage"]["prompt_tokens"]
    assert [choice["text"] for choice in alone["choices"]] == ["alpha beta", "alpha beta"]
    for choice in alone["choices"]:
        assert choice["logprobs"]["tokens"] == single["logprobs"]["tokens"][:prompt_tokens]
        assert choice["logprobs"]["token_logprobs"][0] is None
    assert alone["usage"]["completion_tokens"] == 0
