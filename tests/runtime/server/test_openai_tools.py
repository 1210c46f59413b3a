"""Tool calling through the official `openai` client, over loopback, and its parts.

The server runs the synthetic model with printable-ASCII output (`test_openai_structured`):
left to itself it writes noise, so every call it makes under a required or named
`tool_choice` is the grammar's doing. A call goes out as `message.tool_calls` (whole) or as
deltas the client's stream assembles, with `finish_reason: "tool_calls"`; the round trip
(call, `tool` message with the result, the answer) is accepted and shown to the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest

from fleetserve_runtime.core.config_sections import GenerationConfig
from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.server.generation_schemas import RequestControls
from fleetserve_runtime.server.openai_requests import ChatCompletionRequest, chat_generation
from fleetserve_runtime.server.openai_tools import TOOL_PROMPT, Tool, Toolbox
from tests.runtime.server.test_openai_client import client, running
from tests.runtime.server.test_openai_structured import LLM

CITY: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": CITY},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"utc": {"type": "boolean"}},
                "required": ["utc"],
                "additionalProperties": False,
            },
        },
    },
]
MESSAGES: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def api() -> Iterator[openai.OpenAI]:
    with running(LLM, ready_s=100) as url, client(url) as api:
        yield api


def streamed_calls(api: openai.OpenAI, **body: Any) -> tuple[list[dict[str, str]], str | None]:
    """The calls a streamed answer makes, assembled from its deltas, and its finish reason."""
    calls: dict[int, dict[str, str]] = {}
    reason = None
    for chunk in api.chat.completions.create(
        model="test", messages=MESSAGES, tools=TOOLS, stream=True, **body
    ):
        for choice in chunk.choices:
            reason = choice.finish_reason or reason
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return [calls[index] for index in sorted(calls)], reason


def test_a_named_tool_choice_is_called_with_valid_arguments(api: openai.OpenAI) -> None:
    whole = api.chat.completions.create(
        model="test", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, max_tokens=64
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), CITY)  # type: ignore[union-attr]
    (streamed,), reason = streamed_calls(api, tool_choice=NAMED, max_tokens=64)
    assert reason == "tool_calls"
    assert streamed["name"] == "get_weather"
    assert streamed["id"].startswith("call_")
    jsonschema.validate(json.loads(streamed["arguments"]), CITY)


def test_required_calls_one_of_the_tools_in_every_choice(api: openai.OpenAI) -> None:
    whole = api.chat.completions.create(
        model="test",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        n=8,
        temperature=1.0,
        seed=3,
        max_tokens=64,
    )
    for choice in whole.choices:
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls or []
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
        name = call.function.name  # type: ignore[union-attr]
        jsonschema.validate(json.loads(call.function.arguments), schema[name])  # type: ignore[union-attr]


def test_a_call_round_trips_to_an_answer(api: openai.OpenAI) -> None:
    """Call, the tool's result in a `tool` message, then the model's answer in text."""
    first = api.chat.completions.create(
        model="test", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, max_tokens=64
    )
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    history: Any = [
        *MESSAGES,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'},
    ]
    for stream in (False, True):
        answer = api.chat.completions.create(
            model="test",
            messages=history,
            tools=TOOLS,
            tool_choice="none",
            max_tokens=8,
            stream=stream,
        )
        if stream:
            chunks = list(answer)  # type: ignore[call-overload]
            assert chunks[-1].choices[0].finish_reason == "length"
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            assert answer.choices[0].finish_reason == "length"  # type: ignore[union-attr]
            assert answer.choices[0].message.content  # type: ignore[union-attr]


def test_auto_answers_text_the_same_whole_and_streamed(api: openai.OpenAI) -> None:
    """Under `auto` a text answer is text, streamed the same as whole.

    Streamed, it is held back only while it may be a call, then sent on.
    """
    body: Any = {"model": "test", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 12}
    whole = api.chat.completions.create(**body, temperature=0)
    text = whole.choices[0].message.content
    assert text
    assert not whole.choices[0].message.tool_calls
    chunks = list(api.chat.completions.create(**body, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "auto", "logprobs": True}, "logprobs"),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"tools": [{"type": "code_interpreter", "function": {"name": "x"}}]}, "tools.0.type"),
    ],
    ids=["unknown-function", "logprobs", "with-response-format", "not-a-function"],
)
def test_what_cannot_be_served_is_a_400_naming_it(
    api: openai.OpenAI, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="test", messages=MESSAGES, max_tokens=4, **{"tools": TOOLS, **body}
        )
    assert caught.value.param == param


def generation(**body: Any) -> Any:
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, **body})
    return chat_generation(request, controls=RequestControls(), limits=GenerationConfig())


def test_the_tools_and_the_history_are_shown_to_the_model() -> None:
    """Tool list in the system prompt; an assistant's calls as JSON; `none` shows no tools."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    system, user, assistant, tool = generation(messages=history, tools=TOOLS).messages
    assert system.role == "system"
    assert system.content.startswith(TOOL_PROMPT)
    assert '"name": "get_weather"' in system.content
    assert json.loads(assistant.content) == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert (tool.role, tool.content) == ("tool", "sunny")
    assert user.content == MESSAGES[0]["content"]
    assert len(generation(tools=TOOLS, tool_choice="none").messages) == 1


def test_an_answer_is_parsed_into_calls_of_the_offered_functions() -> None:
    tools = [Tool.model_validate(tool) for tool in TOOLS]
    toolbox = Toolbox(tools, None, parallel=True)
    one = '{"name": "get_weather", "arguments": {"city": "Lima"}}'
    (call,) = toolbox.calls(one) or []
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Lima"}'}
    both = f'[{one}, {{"name": "get_time", "arguments": {{"utc": true}}}}]'
    assert [c["function"]["name"] for c in toolbox.calls(both) or []] == [
        "get_weather",
        "get_time",
    ]
    assert Toolbox(tools, None, parallel=False).calls(both) is None
    assert toolbox.calls('{"name": "launch", "arguments": {}}') is None
    assert toolbox.calls("It is sunny.") is None
    assert Toolbox(tools, "none", parallel=True).calls(one) is None


def test_required_without_tools_is_refused() -> None:
    with pytest.raises(InvalidInput) as caught:
        generation(tool_choice="required")
    assert caught.value.param == "tool_choice"
