"""OpenAI's request bodies: chat and legacy completions, and the generation each asks for.

Fields of OpenAI's API this server does not implement (`n` > 1, penalties, `logit_bias`,
log-probabilities, tools, JSON mode, `echo`, `best_of`, `suffix`) are refused with a 400
naming them when set to anything but their no-op value, so a client never gets an answer
computed differently from what it asked; keys OpenAI's API does not know either are ignored,
as OpenAI ignores them. `messages` are bounded (`MAX_MESSAGES`). `chat_generation` and
`completion_generation` are the pure translation of a validated body to the engine's
`GenerationRequest`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetserve_runtime.core.config import GenerationConfig
from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.generate.contracts import GenerationRequest
from fleetserve_runtime.models.causal_lm import ChatMessage
from fleetserve_runtime.server.generation_schemas import (
    MaxTokens,
    RequestControls,
    SamplingFields,
    TokenId,
    sampling_params,
)

__all__ = [
    "MAX_MESSAGES",
    "ChatCompletionRequest",
    "CompletionRequest",
    "StreamOptions",
    "chat_generation",
    "completion_generation",
]

MAX_MESSAGES = 1024
"""Most messages in one chat request, and content parts in one message."""


class StreamOptions(BaseModel):
    """`stream_options`: only `include_usage` changes anything here."""

    include_usage: bool = False


class _OpenAIRequest(SamplingFields):
    """Fields chat and legacy completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=256)
    max_tokens: MaxTokens | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class ChatMessageIn(BaseModel):
    """One message of `messages`; `name` and other keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str
    """A string, or text parts (`[{"type": "text", "text": ...}]`), joined by newlines."""

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        if not 0 < len(value) <= MAX_MESSAGES:
            msg = f"content must have 1 to {MAX_MESSAGES} parts, got {len(value)}"
            raise ValueError(msg)
        texts: list[str] = []
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            text = part.get("text") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(text, str):
                msg = f"only text content parts are supported, got {str(kind)[:40]!r}"
                raise ValueError(msg)
            texts.append(text)
        return "\n".join(texts)


class ChatCompletionRequest(_OpenAIRequest):
    """`POST /v1/chat/completions` body."""

    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_OpenAIRequest):
    """`POST /v1/completions` body; `max_tokens` defaults to 16, as OpenAI's does."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: MaxTokens | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


_NO_OP: dict[str, tuple[object, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "logit_bias": (None, {}),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (False,),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
}
"""OpenAI fields this server does not implement, and the values that ask for nothing."""


def _refuse_unsupported(body: _OpenAIRequest) -> None:
    for name, no_op in _NO_OP.items():
        if name not in type(body).model_fields:
            continue
        value = getattr(body, name)
        # `0 == False`: a completion's `logprobs=0` asks for log-probabilities, `False` does not.
        if not any(
            value == allowed and isinstance(value, bool) == isinstance(allowed, bool)
            for allowed in no_op
        ):
            shown = repr(value)[:60]
            msg = f"{name}={shown} is not supported by this server"
            if name == "n":
                msg = f"n={shown}: only one choice per request is supported (n must be 1)"
            raise InvalidInput(msg, param=name)


def _check_stream_options(body: _OpenAIRequest) -> None:
    if body.stream_options is not None and not body.stream:
        msg = "stream_options is only allowed when stream is true"
        raise InvalidInput(msg, param="stream_options")


def chat_generation(
    body: ChatCompletionRequest, *, controls: RequestControls, limits: GenerationConfig
) -> GenerationRequest:
    """The generation a chat request asks for; `InvalidInput` (naming the field) if refused."""
    _check_stream_options(body)
    _refuse_unsupported(body)
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        msg = "set max_completion_tokens or max_tokens, not both"
        raise InvalidInput(msg, param="max_completion_tokens")
    messages = tuple(
        ChatMessage(role="system" if m.role == "developer" else m.role, content=m.content)
        for m in body.messages
    )
    field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    return GenerationRequest(
        sampling=sampling_params(
            body, max_tokens=max_tokens, limits=limits, max_tokens_field=field
        ),
        messages=messages,
        priority=controls.priority,
        timeout_s=controls.timeout_s,
        request_id=controls.request_id,
    )


def _single_prompt(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> str | Sequence[int]:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1 and all(isinstance(item, str | list) for item in prompt):
        msg = f"prompt holds {len(prompt)} prompts; send one prompt per request"
        raise InvalidInput(msg, param="prompt")
    first = prompt[0] if prompt else None
    if isinstance(first, str | list):
        return first
    return [item for item in prompt if isinstance(item, int)]


def completion_generation(
    body: CompletionRequest, *, controls: RequestControls, limits: GenerationConfig
) -> GenerationRequest:
    """The generation a legacy completion request asks for; one prompt (text or token ids)."""
    _check_stream_options(body)
    _refuse_unsupported(body)
    prompt = _single_prompt(body.prompt)
    if len(prompt) == 0:
        msg = "prompt must not be empty"
        raise InvalidInput(msg, param="prompt")
    sampling = sampling_params(body, max_tokens=body.max_tokens, limits=limits)
    text, token_ids = (prompt, None) if isinstance(prompt, str) else (None, tuple(prompt))
    return GenerationRequest(
        sampling=sampling,
        prompt=text,
        prompt_token_ids=token_ids,
        priority=controls.priority,
        timeout_s=controls.timeout_s,
        request_id=controls.request_id,
    )
