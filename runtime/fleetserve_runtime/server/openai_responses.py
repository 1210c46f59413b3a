"""OpenAI's answers: chat completions and their chunks, text completions, models, errors.

`TypedDict`s serialised with orjson: streaming writes one per token, so they cost no
validation. `openai_error` is OpenAI's error shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict

from fleetserve_runtime.generate.contracts import FinishReason, Usage
from fleetserve_runtime.server.generation_schemas import UsageBody, usage_body

__all__ = [
    "ChatChunk",
    "ChatCompletion",
    "Completion",
    "ErrorBody",
    "ModelCard",
    "ModelList",
    "chat_chunk",
    "chat_completion",
    "completion_chunk",
    "error_type",
    "openai_error",
]


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


def chat_completion(
    *,
    id_: str,
    created: int,
    model: str,
    choices: Sequence[tuple[str, FinishReason]],
    usage: Usage,
) -> ChatCompletion:
    """The body of a non-streamed chat completion: one choice per (text, reason), by index."""
    listed: list[ChatChoice] = []
    for index, (text, reason) in enumerate(choices):
        message: AssistantMessage = {"role": "assistant", "content": text}
        listed.append(
            {"index": index, "message": message, "logprobs": None, "finish_reason": reason.value}
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
    delta: dict[str, str] | None,
    reason: FinishReason | None = None,
    usage: Usage | None = None,
    null_usage: bool = False,
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
            "logprobs": None,
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
    index: int = 0,
    more: Sequence[tuple[str, FinishReason]] = (),
) -> Completion:
    """One `text_completion` (a stream chunk, or the whole answer); `text=None`: usage only.

    `null_usage` as `chat_chunk`'s; `more` are the whole answer's further choices (`n` > 1),
    indexed after this one.
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
        body["choices"] = [
            {"index": index, "text": text, "logprobs": None, "finish_reason": finish},
            *(
                CompletionChoice(
                    index=index + 1 + n, text=other, logprobs=None, finish_reason=why.value
                )
                for n, (other, why) in enumerate(more)
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
