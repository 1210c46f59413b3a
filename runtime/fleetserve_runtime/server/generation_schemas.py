"""Wire shapes of generation: the OpenAI-compatible API and the OIP generate extension.

Also the pure translation of a validated body to the engine's `GenerationRequest`.
Requests are pydantic models: ranges (`temperature` in [0, 2], `top_p` in (0, 1], at most
four `stop` strings, bounded `messages`) are checked by `decode_body`, which refuses a bad
body with a 400 naming the field, before anything is tokenised (the engine bounds the
prompt's characters by its context before its tokenizer runs). Fields of OpenAI's API this
server does not implement (`n` > 1, penalties, `logit_bias`, log-probabilities, tools, JSON
mode, `echo`, `best_of`, `suffix`) are refused with a 400 naming them when set to anything
but their no-op value, so a client never gets an answer computed differently from what it
asked; keys OpenAI's API does not know either are ignored, as OpenAI ignores them. The OIP
generate body (`text_input`, `parameters`) is strict: its parameters are few, and a
misspelt one is refused.

Responses are `TypedDict`s serialised with orjson: streaming writes one per token, so they
cost no validation. `openai_error` is OpenAI's error shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypedDict

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from fleetserve_runtime.core.config import GenerationConfig
from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.generate.contracts import (
    FinishReason,
    GenerationRequest,
    SamplingParams,
    Usage,
)
from fleetserve_runtime.models.causal_lm import ChatMessage

__all__ = [
    "MAX_MESSAGES",
    "MAX_STOPS",
    "MAX_STOP_CHARS",
    "ChatChunk",
    "ChatCompletion",
    "ChatCompletionRequest",
    "Completion",
    "CompletionRequest",
    "ErrorBody",
    "GenerateParameters",
    "GenerateRequest",
    "GenerateResponse",
    "ModelCard",
    "ModelList",
    "RequestControls",
    "chat_chunk",
    "chat_completion",
    "chat_generation",
    "completion_chunk",
    "completion_generation",
    "error_type",
    "oip_generation",
    "openai_error",
    "usage_body",
]

MAX_MESSAGES = 1024
"""Most messages in one chat request, and content parts in one message."""
MAX_STOPS = 4
"""Most stop strings, as OpenAI allows."""
MAX_STOP_CHARS = 256
"""Longest stop string, in characters."""


def _check_stops(value: str | list[str]) -> str | list[str]:
    stops = [value] if isinstance(value, str) else value
    if len(stops) > MAX_STOPS:
        msg = f"at most {MAX_STOPS} stop strings are allowed, got {len(stops)}"
        raise ValueError(msg)
    for stop in stops:
        if not 0 < len(stop) <= MAX_STOP_CHARS:
            msg = f"stop strings must have 1 to {MAX_STOP_CHARS} characters, got {len(stop)}"
            raise ValueError(msg)
    return value


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=-1)]
"""0 or -1 (vLLM's spelling): no top-k cut."""
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
MaxTokens = Annotated[int, Field(ge=1)]
Stop = Annotated[str | list[str], AfterValidator(_check_stops)]
TokenId = Annotated[int, Field(ge=0, strict=True)]
"""Strict: `true` or `1.0` is no token id (lax parsing would read them as 1)."""


class SamplingFields(BaseModel):
    """How to decode, as every generation API spells it; None takes OpenAI's default."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    ignore_eos: bool = False
    """Not OpenAI's (vLLM's extension): generate exactly `max_tokens`, as benchmarks do."""


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


class GenerateParameters(SamplingFields):
    """`parameters` of an OIP generate request."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: MaxTokens | None = None
    priority: Literal["high", "normal", "low"] | None = None
    timeout_ms: int | None = Field(None, ge=1)
    stream: bool | None = None
    """Accepted as Triton's clients send it; the endpoint (`generate_stream`) decides."""


class GenerateRequest(BaseModel):
    """`POST /v2/models/{name}/generate` (and `generate_stream`) body."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, max_length=256)
    text_input: str = Field(min_length=1)
    parameters: GenerateParameters = GenerateParameters()


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


@dataclass(frozen=True, slots=True)
class RequestControls:
    """Scheduling the caller asked for (priority, timeout) and the request's id."""

    priority: Priority = Priority.NORMAL
    timeout_s: float | None = None
    request_id: str | None = None


def _sampling(
    fields: SamplingFields,
    *,
    max_tokens: int | None,
    limits: GenerationConfig,
    prefix: str = "",
    max_tokens_field: str = "max_tokens",
) -> SamplingParams:
    """The engine's `SamplingParams`; OpenAI's defaults (temperature 1, top-p 1).

    An unset `max_tokens` stays unset: the engine, which knows the prompt's length, takes
    `generation.default_max_tokens` or what the context leaves, whichever is less. A larger
    `max_tokens` than `limits` allow, or `ignore_eos` where it is off, is an `InvalidInput`
    naming the field (`prefix` + its name) and the setting.
    """
    if max_tokens is not None and max_tokens > limits.max_output_tokens:
        msg = (
            f"{prefix}{max_tokens_field} {max_tokens} is over this server's limit of "
            f"{limits.max_output_tokens} output tokens (generation.max_output_tokens)"
        )
        raise InvalidInput(msg, param=prefix + max_tokens_field)
    if fields.ignore_eos and not limits.allow_ignore_eos:
        msg = f"{prefix}ignore_eos is not allowed on this server (generation.allow_ignore_eos)"
        raise InvalidInput(msg, param=prefix + "ignore_eos")
    stops = [fields.stop] if isinstance(fields.stop, str) else fields.stop or []
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if fields.temperature is None else fields.temperature,
        top_p=1.0 if fields.top_p is None else fields.top_p,
        top_k=max(fields.top_k or 0, 0),
        seed=fields.seed,
        stop=tuple(stops),
        ignore_eos=fields.ignore_eos,
    )


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
        sampling=_sampling(body, max_tokens=max_tokens, limits=limits, max_tokens_field=field),
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
    sampling = _sampling(body, max_tokens=body.max_tokens, limits=limits)
    text, token_ids = (prompt, None) if isinstance(prompt, str) else (None, tuple(prompt))
    return GenerationRequest(
        sampling=sampling,
        prompt=text,
        prompt_token_ids=token_ids,
        priority=controls.priority,
        timeout_s=controls.timeout_s,
        request_id=controls.request_id,
    )


def oip_generation(
    body: GenerateRequest,
    *,
    controls: RequestControls,
    limits: GenerationConfig,
    version: str | None,
) -> GenerationRequest:
    """The generation an OIP generate request asks for (of `version`, or the active one).

    `controls` already weigh the body's `priority` and `timeout_ms` against the headers.
    """
    params = body.parameters
    return GenerationRequest(
        sampling=_sampling(
            params, max_tokens=params.max_tokens, limits=limits, prefix="parameters."
        ),
        prompt=body.text_input,
        priority=controls.priority,
        timeout_s=controls.timeout_s,
        version=version,
        request_id=controls.request_id,
    )


# -- responses -----------------------------------------------------------------------------


class PromptTokensDetails(TypedDict):
    """Prompt tokens served from the prefix cache."""

    cached_tokens: int


class UsageBody(TypedDict):
    """`usage` of a response or of a stream's last chunk."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(TypedDict):
    """The answer of a chat completion."""

    role: Literal["assistant"]
    content: str


class ChatChoice(TypedDict):
    """The one choice of a chat completion."""

    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: str


class ChatCompletion(TypedDict):
    """A whole chat completion (`stream: false`)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageBody


class ChatChunkChoice(TypedDict):
    """The choice of a stream chunk: the text added since the last chunk."""

    index: int
    delta: dict[str, str]
    logprobs: None
    finish_reason: str | None


class ChatChunk(TypedDict, total=False):
    """One `chat.completion.chunk` of a stream; `usage` only where it is due."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageBody | None


class CompletionChoice(TypedDict):
    """The one choice of a legacy completion, or of one of its stream chunks."""

    index: int
    text: str
    logprobs: None
    finish_reason: str | None


class Completion(TypedDict, total=False):
    """A `text_completion`: a whole answer, or one stream chunk of it."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageBody | None


class ModelCard(TypedDict):
    """One entry of `GET /v1/models`."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(TypedDict):
    """`GET /v1/models`."""

    object: Literal["list"]
    data: list[ModelCard]


class GenerateResponse(TypedDict, total=False):
    """An OIP generate answer, or one `generate_stream` event.

    `finish_reason` and `usage` come with the whole answer and with a stream's last event.
    """

    model_name: str
    model_version: str
    text_output: str
    id: str
    finish_reason: str
    usage: UsageBody


class ErrorDetail(TypedDict):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(TypedDict):
    """An error answer (or stream event); `request_id` finds it in the server's log."""

    error: ErrorDetail
    request_id: str


def usage_body(usage: Usage) -> UsageBody:
    """OpenAI's `usage` of the engine's counts."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def chat_completion(
    *, id_: str, created: int, model: str, text: str, reason: FinishReason, usage: Usage
) -> ChatCompletion:
    """The body of a non-streamed chat completion."""
    message: AssistantMessage = {"role": "assistant", "content": text}
    choice: ChatChoice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": reason.value,
    }
    return {
        "id": id_,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_body(usage),
    }


def chat_chunk(
    *,
    id_: str,
    created: int,
    model: str,
    delta: dict[str, str] | None,
    reason: FinishReason | None = None,
    usage: Usage | None = None,
    null_usage: bool = False,
) -> ChatChunk:
    """One stream chunk; `delta=None` gives the usage-only chunk (no choices).

    `null_usage`: a chunk without usage says `"usage": null`, as OpenAI's do when the stream
    was asked to include usage (strict clients read the key on every chunk then).
    """
    chunk: ChatChunk = {
        "id": id_,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
    }
    if delta is not None:
        finish = reason.value if reason is not None else None
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    if usage is not None:
        chunk["usage"] = usage_body(usage)
    elif null_usage:
        chunk["usage"] = None
    return chunk


def completion_chunk(
    *,
    id_: str,
    created: int,
    model: str,
    text: str | None,
    reason: FinishReason | None = None,
    usage: Usage | None = None,
    null_usage: bool = False,
) -> Completion:
    """One `text_completion` (a stream chunk, or the whole answer); `text=None`: usage only.

    `null_usage` as `chat_chunk`'s.
    """
    body: Completion = {
        "id": id_,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [],
    }
    if text is not None:
        finish = reason.value if reason is not None else None
        body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage_body(usage)
    elif null_usage:
        body["usage"] = None
    return body


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
}


def error_type(status: int) -> str:
    """OpenAI's error `type` for a status: what kind of fault, and whose."""
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def openai_error(
    status: int, message: str, *, request_id: str, param: str | None, code: str | None
) -> ErrorBody:
    """OpenAI's error shape, with the request id (also in the `X-Request-ID` header)."""
    detail: ErrorDetail = {
        "message": message,
        "type": error_type(status),
        "param": param,
        "code": code,
    }
    return {"error": detail, "request_id": request_id}
