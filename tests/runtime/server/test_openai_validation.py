"""What the OpenAI routes refuse, and how: a 400 in OpenAI's shape naming the field.

Invalid values, keys this server does not implement (vLLM's and SGLang's extensions among
them, which would change the answer if ignored), keys in messages, bad token-id prompts, a
prompt over the context; and the keys that are implemented or harmless, answered.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from fleetserve_runtime.testing.asgi import serve
from tests.runtime.server.openai_testing import (
    CHAT,
    CONTEXT,
    LLM,
    assert_openai_error,
    chat,
    events,
)

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
