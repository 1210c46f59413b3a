"""The OpenAI-compatible routes in process (ASGI transport, real lifespan, synthetic LLM).

Shapes as OpenAI's, streamed and whole; every refusal OpenAI-shaped with the field it names
and the status clients expect (400 for a prompt over the context, 404, 503 + Retry-After,
504); errors inside a stream as an error event, then `[DONE]`; every answer counted in the
request metrics.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve_runtime.core.config import GenerationConfig
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

CONTEXT = 64
LLM = f"builtin://synthetic-generate?per_token_ms=0&output_tokens=12&context_length={CONTEXT}"
SLOW_LLM = f"builtin://synthetic-generate?per_token_ms=40&output_tokens=40&context_length={CONTEXT}"
CHAT = "/v1/chat/completions"
TOKEN = "openai-route-token-0123456789"


def chat(content: str = "tell me about rivers", **fields: Any) -> dict[str, Any]:
    return {"model": "test", "messages": [{"role": "user", "content": content}], **fields}


def events(response: httpx.Response) -> list[Any]:
    """The SSE `data:` payloads of a stream, JSON-decoded (`[DONE]` kept as the string)."""
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.endswith("\n\n")
    payloads: list[Any] = []
    for block in response.text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    """An OpenAI-shaped error with `status` naming `param`; returns its `error` object."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "request_id"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["message"]
    return dict(error)


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


INVALID = [
    pytest.param({"temperature": 2.5}, "temperature", id="temperature-over-2"),
    pytest.param({"temperature": -0.1}, "temperature", id="temperature-negative"),
    pytest.param({"top_p": 0}, "top_p", id="top-p-zero"),
    pytest.param({"top_p": 1.5}, "top_p", id="top-p-over-1"),
    pytest.param({"max_tokens": 0}, "max_tokens", id="max-tokens-zero"),
    pytest.param({"max_completion_tokens": -3}, "max_completion_tokens", id="max-completion-neg"),
    pytest.param({"top_k": -2}, "top_k", id="top-k-negative"),
    pytest.param({"seed": 2**64}, "seed", id="seed-over-int64"),
    pytest.param({"stop": ["a", "b", "c", "d", "e"]}, "stop", id="five-stops"),
    pytest.param({"stop": ""}, "stop", id="empty-stop"),
    pytest.param({"logprobs": True, "top_logprobs": 21}, "top_logprobs", id="top-logprobs-21"),
    pytest.param({"logprobs": True, "top_logprobs": -1}, "top_logprobs", id="top-logprobs-neg"),
    pytest.param({"top_logprobs": 2}, "top_logprobs", id="top-logprobs-without-logprobs"),
    pytest.param({"logprobs": 3}, "logprobs", id="logprobs-not-bool"),
    pytest.param({"n": 17}, "n", id="n-17"),
    pytest.param({"n": 0}, "n", id="n-0"),
    pytest.param({"n": 16, "max_tokens": 300}, "n", id="n-times-max-tokens-over-the-limit"),
    pytest.param({"n": 9}, "n", id="n-times-default-max-tokens-over-the-limit"),
    pytest.param({"presence_penalty": 2.5}, "presence_penalty", id="presence-penalty-over-2"),
    pytest.param({"frequency_penalty": -2.1}, "frequency_penalty", id="frequency-under-minus-2"),
    pytest.param({"repetition_penalty": 0}, "repetition_penalty", id="repetition-penalty-zero"),
    pytest.param({"min_p": 1.5}, "min_p", id="min-p-over-1"),
    pytest.param({"min_tokens": -1}, "min_tokens", id="min-tokens-negative"),
    pytest.param({"min_tokens": 9, "max_tokens": 8}, "min_tokens", id="min-tokens-over-max"),
    pytest.param({"logit_bias": {"5": 101}}, "logit_bias.5", id="logit-bias-over-100"),
    pytest.param({"logit_bias": {"x": 1}}, "logit_bias", id="logit-bias-not-an-id"),
    pytest.param(
        {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", id="logit-bias-301"
    ),
    pytest.param({"logit_bias": {"99999": 1}}, "logit_bias", id="logit-bias-past-vocab"),
    pytest.param({"stop_token_ids": [99999]}, "stop_token_ids", id="stop-token-past-vocab"),
    pytest.param({"stop_token_ids": [1] * 65}, "stop_token_ids", id="65-stop-token-ids"),
    pytest.param({"stop_token_ids": [-1]}, "stop_token_ids.0", id="stop-token-negative"),
    pytest.param({"tools": [{"type": "function"}]}, "tools.0.function", id="tools"),
    pytest.param(
        {"tools": [{"type": "web_search", "function": {"name": "f"}}]},
        "tools.0.type",
        id="tool-type",
    ),
    pytest.param({"store": True}, "store", id="store"),
    pytest.param({"service_tier": "flex"}, "service_tier", id="service-tier"),
    pytest.param({"modalities": ["text", "audio"]}, "modalities", id="audio-out"),
    pytest.param({"stream_options": {"include_usage": True}}, "stream_options", id="no-stream"),
    pytest.param({"messages": []}, "messages", id="no-messages"),
    pytest.param({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", id="role"),
    pytest.param({"messages": [{"role": "tool", "content": "x"}]}, "messages.0", id="tool-no-id"),
    pytest.param(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages.0.content",
        id="image-part",
    ),
    pytest.param({"messages": [{"role": "user", "content": "x"}] * 1025}, "messages", id="1025"),
    pytest.param({"model": ""}, "model", id="empty-model"),
    pytest.param({"cache_salt": ""}, "cache_salt", id="empty-cache-salt"),
    pytest.param({"cache_salt": "s" * 257}, "cache_salt", id="long-cache-salt"),
]


@pytest.mark.parametrize(("fields", "param"), INVALID)
async def test_invalid_requests_get_400_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    """Out-of-range or unsupported fields: 400, OpenAI-shaped, naming the field."""
    async with serve(LLM) as (client, _):
        response = await client.post(CHAT, json=chat(**fields))
    error = assert_openai_error(response, 400, param)
    assert error["type"] == "invalid_request_error"


VLLM_KEYS = [
    pytest.param("include_stop_str_in_output", True, id="include_stop_str_in_output"),
    pytest.param("continue_final_message", True, id="continue_final_message"),
    pytest.param("guided_json", {"type": "object"}, id="guided_json"),
    pytest.param("chat_template_kwargs", {"enable_thinking": False}, id="chat_template_kwargs"),
    pytest.param("truncate_prompt_tokens", 8, id="truncate_prompt_tokens"),
]
"""vLLM's and SGLang's extensions that would change the answer if honoured: silently
ignoring them would answer with other text."""


def assert_refused(response: httpx.Response, param: str, message: str) -> None:
    """A 400 naming the unsupported keys, in the same shape as every other refusal."""
    error = assert_openai_error(response, 400, param)
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_input")
    assert error["message"] == message


@pytest.mark.parametrize(("key", "value"), VLLM_KEYS)
async def test_unknown_keys_are_400_naming_them(key: str, value: Any) -> None:
    """A key this server does not implement is refused, not ignored, on both routes."""
    async with serve(LLM) as (client, _):
        chatted = await client.post(CHAT, json=chat(**{key: value}))
        completed = await client.post(
            "/v1/completions", json={"model": "test", "prompt": "x", key: value}
        )
    assert_refused(chatted, key, f"unsupported parameter: {key!r}")
    assert_refused(completed, key, f"unsupported parameter: {key!r}")


async def test_every_unknown_key_is_named_sorted_and_bounded() -> None:
    """Body keys sorted, then `stream_options`', then each message's; at most eight named."""
    several = chat(
        spaces_between_special_tokens=False,
        truncate_prompt_tokens=8,
        guided_json={},
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        messages=[
            {"role": "user", "content": "x", "name": "ann"},
            {"role": "assistant", "content": "y", "reasoning_content": "z"},
        ],
    )
    many = chat(**{f"key_{i:02}": i for i in range(11)})
    async with serve(LLM) as (client, _):
        named = await client.post(CHAT, json=several)
        bounded = await client.post(CHAT, json=many)
        chat_only = await client.post(
            "/v1/completions", json={"model": "test", "prompt": "x", "metadata": {}}
        )
    assert_refused(
        named,
        "guided_json",
        "unsupported parameters: 'guided_json', 'spaces_between_special_tokens', "
        "'truncate_prompt_tokens', "
        "'stream_options.continuous_usage_stats', 'messages[1].reasoning_content'",
    )
    shown = ", ".join(f"'key_{i:02}'" for i in range(8))
    assert_refused(bounded, "key_00", f"unsupported parameters: {shown} and 3 more")
    assert_refused(chat_only, "metadata", "unsupported parameter: 'metadata'")


async def test_a_message_key_is_refused_naming_its_path() -> None:
    """`messages[i].<key>` in the message, dotted in `param` as every field path is."""
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "assistant", "content": "ok", "reasoning_content": "hm"},
    ]
    async with serve(LLM) as (client, _):
        response = await client.post(CHAT, json=chat(messages=messages))
    assert_refused(
        response,
        "messages.1.reasoning_content",
        "unsupported parameter: 'messages[1].reasoning_content'",
    )


async def test_implemented_and_harmless_keys_are_answered() -> None:
    """Sampling keys this server implements, and metadata that cannot change the answer."""
    implemented = {"top_k": 0, "seed": 7, "stop": ["zzz"], "temperature": 0, "max_tokens": 8}
    harmless = {
        "user": "u-1",
        "safety_identifier": "u-1",
        "metadata": {"team": "a"},
        "store": False,
        "service_tier": "auto",
        "modalities": ["text"],
        "parallel_tool_calls": False,
        "stream_options": {"include_usage": True},
    }
    named = [{"role": "user", "content": "tell me about rivers", "name": "ann"}]
    async with serve(LLM) as (client, _):
        plain = await client.post(CHAT, json=chat(**implemented))
        both = await client.post(
            CHAT, json=chat(**implemented, **harmless, stream=True, messages=named)
        )
        completed = await client.post(
            "/v1/completions", json={"model": "test", "prompt": "x", "user": "u", **implemented}
        )
    assert plain.status_code == 200, plain.text
    assert both.status_code == 200, both.text
    assert completed.status_code == 200, completed.text
    streamed = "".join(
        chunk["choices"][0]["delta"].get("content", "")
        for chunk in events(both)
        if isinstance(chunk, dict) and chunk["choices"]
    )
    assert streamed == plain.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "prompt",
    [[10**9], [-1], [2**70], [True], [1.0], [[3, 10**9]]],
    ids=["past-vocabulary", "negative", "over-int64", "bool", "float", "nested-past-vocabulary"],
)
async def test_bad_prompt_token_ids_are_400_naming_prompt(prompt: list[Any]) -> None:
    """Token ids the model has no embedding for, or that are not integers: 400 naming `prompt`."""
    async with serve(LLM) as (client, _):
        response = await client.post("/v1/completions", json={"model": "test", "prompt": prompt})
    assert_openai_error(response, 400, "prompt")


async def test_prompt_over_the_context_is_400_naming_the_limit() -> None:
    """Not 413: clients treat 400 `context_length_exceeded` as "shorten the prompt"."""
    async with serve(LLM) as (client, _):
        response = await client.post(CHAT, json=chat(" ".join(["word"] * CONTEXT)))
        completion = await client.post(
            "/v1/completions", json={"model": "test", "prompt": "a b c", "max_tokens": CONTEXT}
        )
    error = assert_openai_error(response, 400, "messages")
    assert error["code"] == "context_length_exceeded"
    assert f"context of {CONTEXT} tokens" in error["message"]
    assert assert_openai_error(completion, 400, "prompt")["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(CHAT, chat(" ".join(["word"] * 40)), id="chat"),
        pytest.param(
            "/v2/models/test/generate", {"text_input": " ".join(["word"] * 40)}, id="generate"
        ),
    ],
)
async def test_unset_max_tokens_stops_at_the_end_of_the_context(
    path: str, body: dict[str, Any]
) -> None:
    """No `max_tokens`, a default beyond the context: served up to the context's end.

    The finish reason is "length" exactly when prompt plus completion fill it, as OpenAI's.
    """
    sampling = {"ignore_eos": True, "temperature": 0}
    generation = {"allow_ignore_eos": True, "default_max_tokens": 4 * CONTEXT}
    async with serve(LLM, generation=generation) as (client, _):
        if "messages" in body:
            response = await client.post(path, json={**body, **sampling})
        else:
            response = await client.post(path, json={**body, "parameters": sampling})
    assert response.status_code == 200, response.text
    answer = response.json()
    usage = answer["usage"]
    assert usage["prompt_tokens"] > CONTEXT // 2
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT
    reason = (
        answer["choices"][0]["finish_reason"] if "choices" in answer else answer["finish_reason"]
    )
    assert reason == "length"


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
