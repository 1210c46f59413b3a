"""OpenAI's answers: chat completions and their chunks, text completions, models, errors.

`TypedDict`s serialised with orjson: streaming writes one per token, so they cost no
validation. `openai_error` is OpenAI's error shape. Log-probabilities come in the two shapes
OpenAI defines: chat's `ChatLogprobs` (`content`: one `ChatTokenLogprob` per token, with
its UTF-8 `bytes` and `top_logprobs`) and completions' `CompletionLogprobs` (parallel lists
`tokens`, `token_logprobs`, `top_logprobs` of {token: logprob}, `text_offset`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NotRequired, TypedDict

from fleetserve_runtime.generate.contracts import FinishReason, TokenLogprob, Usage
from fleetserve_runtime.server.generation_schemas import UsageBody, usage_body
from fleetserve_runtime.server.openai_tools import ToolCallBody

__all__ = [
    "ChatChunk",
    "ChatCompletion",
    "ChatLogprobs",
    "ChatTokenLogprob",
    "Completion",
    "CompletionLogprobs",
    "ErrorBody",
    "ModelCard",
    "ModelList",
    "chat_chunk",
    "chat_completion",
    "chat_logprobs",
    "completion_chunk",
    "completion_logprobs",
    "error_type",
    "openai_error",
]


class AssistantMessage(TypedDict):
    """The answer of a chat completion: text, or (content null) calls of the tools."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCallBody]]


class TopLogprob(TypedDict):
    """One of the most likely tokens at a position."""

    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    """One output token of a chat answer, with the most likely tokens at its position."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    """A chat choice's (or chunk's) `logprobs`: its tokens, in order."""

    content: list[ChatTokenLogprob]


class CompletionLogprobs(TypedDict):
    """A completion choice's (or chunk's) `logprobs`, as parallel lists over its tokens.

    An echoed prompt's first token has no log-probability (null) and no alternatives.
    `text_offset` is where each token starts in the choice's text (summing the tokens'
    lengths, as vLLM does).
    """

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChatChoice(TypedDict):
    """The one choice of a chat completion."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
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
    delta: dict[str, object]
    logprobs: ChatLogprobs | None
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
    logprobs: CompletionLogprobs | None
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


def _top(entry: TokenLogprob) -> TopLogprob:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.token.encode())}


def chat_logprobs(entries: Sequence[TokenLogprob]) -> ChatLogprobs:
    """Chat's `logprobs` of output tokens: each with its bytes and its alternatives."""
    return {
        "content": [
            {**_top(entry), "top_logprobs": [_top(other) for other in entry.top]}
            for entry in entries
        ]
    }


def completion_logprobs(
    tokens: Sequence[tuple[str, TokenLogprob | None]], offset: int
) -> CompletionLogprobs:
    """Completions' `logprobs` of (token text, entry) pairs whose text starts at `offset`.

    An entry of None (an echoed prompt's first token) has a null log-probability and no
    alternatives. Each `top_logprobs` dict holds the alternatives and the chosen token
    (OpenAI: "up to logprobs + 1 elements"); tokens that spell the same text share a key.
    """
    body: CompletionLogprobs = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for text, entry in tokens:
        body["tokens"].append(text)
        body["text_offset"].append(offset)
        offset += len(text)
        if entry is None:
            body["token_logprobs"].append(None)
            body["top_logprobs"].append(None)
            continue
        body["token_logprobs"].append(entry.logprob)
        top: dict[str, float] = {}
        for other in (*entry.top, entry):
            top.setdefault(other.token, other.logprob)
        body["top_logprobs"].append(top)
    return body


def chat_completion(
    *,
    id_: str,
    created: int,
    model: str,
    choices: Sequence[tuple[str, FinishReason, ChatLogprobs | None, list[ToolCallBody] | None]],
    usage: Usage,
) -> ChatCompletion:
    """The body of a non-streamed chat completion.

    A choice per (text, reason, logprobs, tool calls); a choice with calls has null content.
    """
    listed: list[ChatChoice] = []
    for index, (text, reason, logprobs, calls) in enumerate(choices):
        message: AssistantMessage = {"role": "assistant", "content": text}
        if calls:
            message = {"role": "assistant", "content": None, "tool_calls": calls}
        listed.append(
            {
                "index": index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": reason.value,
            }
        )
    return {
        "id": id_,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": listed,
        "usage": usage_body(usage),
    }


class _ChunkUsage(TypedDict, total=False):
    """A chunk's `usage` key, where it has one."""

    usage: UsageBody | None


def _chunk_usage(usage: Usage | None, null_usage: bool) -> _ChunkUsage:
    """The counts where `usage` is given; else `null` when `null_usage`, else no key."""
    if usage is not None:
        return {"usage": usage_body(usage)}
    return {"usage": None} if null_usage else {}


def _finish_reason(reason: FinishReason | None) -> str | None:
    """The finish reason a chunk's choice carries: null until the stream's last text."""
    return reason.value if reason is not None else None


def chat_chunk(
    *,
    id_: str,
    created: int,
    model: str,
    delta: dict[str, object] | None,
    reason: FinishReason | None = None,
    usage: Usage | None = None,
    null_usage: bool = False,
    logprobs: ChatLogprobs | None = None,
    index: int = 0,
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
        **_chunk_usage(usage, null_usage),
    }
    if delta is not None:
        finish = _finish_reason(reason)
        choice: ChatChunkChoice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        chunk["choices"] = [choice]
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
    logprobs: CompletionLogprobs | None = None,
    index: int = 0,
    more: Sequence[tuple[str, FinishReason, CompletionLogprobs | None]] = (),
) -> Completion:
    """One `text_completion` (a stream chunk, or the whole answer); `text=None`: usage only.

    `null_usage` as `chat_chunk`'s; `more` are the whole answer's further choices (`n` > 1),
    as (text, reason, logprobs), indexed after this one.
    """
    body: Completion = {
        "id": id_,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        **_chunk_usage(usage, null_usage),
    }
    if text is not None:
        finish = _finish_reason(reason)
        choice: CompletionChoice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        body["choices"] = [
            choice,
            *(
                CompletionChoice(
                    index=index + 1 + n, text=other, logprobs=scored, finish_reason=why.value
                )
                for n, (other, why, scored) in enumerate(more)
            ),
        ]
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
