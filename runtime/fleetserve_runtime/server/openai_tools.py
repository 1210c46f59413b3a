"""Chat's tools: the functions a request offers, shown to the model, and its calls parsed back.

The chat templates here get messages as role and text (SmolLM2's has no tool section), so
tools travel as text, in one documented format whatever the template:

- The tool list goes at the end of the system prompt (a system message is added first when
  there is none): `TOOL_PROMPT`, then one line per function, `{"name": ..., "description":
  ..., "parameters": <JSON schema>}`.
- A call is the answer `{"name": <function>, "arguments": {...}}`; several calls
  (`parallel_tool_calls`, on by default) are a JSON array of them. An assistant message's
  `tool_calls` in the history are written back in that form; a `tool` message (the result,
  `tool_call_id` naming its call) keeps the role `tool`.
- `tool_choice`: `auto` (the default with tools) lets the model answer text or a call;
  `none` shows no tools and parses nothing; `required` and a named function hold the
  answer to one call (of any tool, of that one) with the output grammar, whose JSON schema
  is the call's: the function's name and its `parameters`.
- An answer that parses as calls of offered functions becomes `message.tool_calls` (each
  with an id, `arguments` as JSON text) and `finish_reason: "tool_calls"`; any other answer
  stays text. Streamed, an answer that starts with `{` or `[` is held back until it ends,
  then sent as one `tool_calls` delta per call (what the `openai` client assembles), or as
  text if it is not a call.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetserve_runtime.generate.contracts import OutputGrammar
from fleetserve_runtime.models.causal_lm import ChatMessage
from fleetserve_runtime.server.openai_structured import ANY_OBJECT, json_grammar

__all__ = [
    "MAX_TOOLS",
    "TOOL_PROMPT",
    "FunctionCallBody",
    "NamedToolChoice",
    "Tool",
    "ToolCallBody",
    "ToolCallIn",
    "ToolChoice",
    "Toolbox",
    "calls_text",
]

MAX_TOOLS = 128
"""Most tools one request may offer (OpenAI's bound)."""
TOOL_PROMPT = (
    "You can call functions. To call one, answer with only a JSON object "
    '{"name": <function name>, "arguments": <arguments object>}; to call several, with a '
    "JSON array of such objects. The functions:"
)
"""What precedes the tool list in the system prompt."""
_FORBID = ConfigDict(extra="forbid")
_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class FunctionDef(BaseModel):
    """A tool's `function`: its name, what it does, the JSON schema of its arguments."""

    model_config = _FORBID

    name: str = Field(pattern=_NAME)
    description: str | None = Field(None, max_length=4096)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    """Accepted: a required or named call is held to the schema either way."""


class Tool(BaseModel):
    """One of `tools`: only functions."""

    model_config = _FORBID

    type: str
    function: FunctionDef

    @field_validator("type")
    @classmethod
    def _function(cls, value: str) -> str:
        if value != "function":
            msg = f"only function tools are supported, got {value[:40]!r}"
            raise ValueError(msg)
        return value


class NamedFunction(BaseModel):
    """`tool_choice.function`."""

    model_config = _FORBID

    name: str = Field(pattern=_NAME)


class NamedToolChoice(BaseModel):
    """`tool_choice` naming the one function to call."""

    model_config = _FORBID

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCallIn(BaseModel):
    """A call's `function` in an assistant message of the history."""

    model_config = _FORBID

    name: str = Field(pattern=_NAME)
    arguments: str = Field(max_length=1 << 20)
    """The arguments as JSON text, as OpenAI writes them."""


class ToolCallIn(BaseModel):
    """One of an assistant message's `tool_calls`."""

    model_config = _FORBID

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"]
    function: FunctionCallIn


class FunctionCallBody(TypedDict):
    """A call's `function` in an answer: arguments as JSON text."""

    name: str
    arguments: str


class ToolCallBody(TypedDict):
    """One of `message.tool_calls` in an answer."""

    id: str
    type: Literal["function"]
    function: FunctionCallBody


def calls_text(calls: Sequence[ToolCallIn]) -> str:
    """An assistant's calls as the model writes them: one object, or an array of several."""
    written = [
        {"name": call.function.name, "arguments": _arguments(call.function.arguments)}
        for call in calls
    ]
    return json.dumps(written[0] if len(written) == 1 else written, ensure_ascii=False)


def _arguments(text: str) -> object:
    """The arguments of a call in the history: JSON text read back, or the text as it is."""
    try:
        return json.loads(text)
    except ValueError:
        return text


class Toolbox:
    """The tools of one chat request, and how its answers are read.

    `active` is False under `tool_choice: none` (or without tools): nothing is shown to the
    model and nothing parsed.
    """

    def __init__(self, tools: Sequence[Tool], choice: ToolChoice | None, *, parallel: bool) -> None:
        self._functions = {tool.function.name: tool.function for tool in tools}
        self._choice: ToolChoice = choice if choice is not None else "auto"
        self._parallel = parallel

    @property
    def active(self) -> bool:
        """Tools are offered and may be called."""
        return bool(self._functions) and self._choice != "none"

    def system_prompt(self) -> str:
        """`TOOL_PROMPT` and the functions, one JSON line each."""
        lines = [
            json.dumps(
                {
                    "name": function.name,
                    "description": function.description or "",
                    "parameters": function.parameters or ANY_OBJECT,
                },
                ensure_ascii=False,
            )
            for function in self._functions.values()
        ]
        return "\n".join([TOOL_PROMPT, *lines])

    def with_tools(self, messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
        """`messages` with the tool list at the end of the system prompt, when active."""
        if not self.active:
            return tuple(messages)
        prompt = self.system_prompt()
        if messages and messages[0].role == "system":
            first = ChatMessage("system", f"{messages[0].content}\n\n{prompt}")
            return (first, *messages[1:])
        return (ChatMessage("system", prompt), *messages)

    def grammar(self) -> OutputGrammar | None:
        """The call grammar `required` or a named `tool_choice` holds the answer to."""
        choice = self._choice
        if isinstance(choice, NamedToolChoice):
            return json_grammar(self._call_schema(choice.function.name), "tool_choice")
        if choice == "required" and self._functions:
            calls = [self._call_schema(name) for name in self._functions]
            schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
            return json_grammar(schema, "tool_choice")
        return None

    def check(self) -> str | None:
        """What is wrong with `tool_choice` against `tools` (the message), or None."""
        choice = self._choice
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in self._functions:
                return f"tool_choice names {choice.function.name!r}, which is not one of tools"
        elif choice == "required" and not self._functions:
            return "tool_choice 'required' needs tools"
        return None

    def _call_schema(self, name: str) -> dict[str, Any]:
        function = self._functions[name]
        return {
            "type": "object",
            "properties": {
                "name": {"const": name},
                "arguments": function.parameters or ANY_OBJECT,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    def may_call(self, text: str) -> bool:
        """Whether an answer beginning with `text` may be a call (it opens a JSON value)."""
        return self.active and text.lstrip()[:1] in ("{", "[")

    def calls(self, text: str) -> list[ToolCallBody] | None:
        """The calls an answer makes, each with a new id; None if it is not calls."""
        if not self.may_call(text):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        items = value if isinstance(value, list) and self._parallel else [value]
        calls: list[ToolCallBody] = []
        for item in items:
            if not isinstance(item, dict) or item.get("name") not in self._functions:
                return None
            arguments = item.get("arguments", {})
            if not isinstance(arguments, dict):
                return None
            calls.append(
                {
                    "id": f"call_{secrets.token_hex(12)}",
                    "type": "function",
                    "function": {
                        "name": item["name"],
                        "arguments": json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
        return calls or None
