"""The answers' shapes: OpenAI's chat and completion objects and chunks, OIP generate's.

A `Format` (`sse`) turns the engine's events into the bytes one API promises: `ChatFormat`
and `CompletionFormat` share the closing chunks (usage, finish reasons) and OpenAI's error
shape (`openai_failure`); `GenerateFormat` writes the OIP generate extension's, with the
runtime's error shape (`oip_failure`). `generation` picks one per route.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Generic, Self, TypeVar

from fleetserve_runtime.core.errors import (
    FleetserveError,
    InputTooLong,
    InvalidInput,
)
from fleetserve_runtime.generate.contracts import (
    FinishEvent,
    FinishReason,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from fleetserve_runtime.server.generation_schemas import usage_body
from fleetserve_runtime.server.http_errors import (
    GENERATION_STATUS_OF,
    Failure,
    error_body,
    error_headers,
    failure_of,
    log_unexpected,
    request_id,
    status_of,
)
from fleetserve_runtime.server.oip_generate_schemas import (
    GenerateResponse,
)
from fleetserve_runtime.server.openai_requests import (
    StreamOptions,
)
from fleetserve_runtime.server.openai_responses import (
    ChatChunk,
    ChatCompletion,
    ChatLogprobs,
    Completion,
    CompletionLogprobs,
    chat_chunk,
    chat_completion,
    chat_logprobs,
    completion_chunk,
    completion_logprobs,
    openai_error,
)
from fleetserve_runtime.server.openai_tools import Toolbox, ToolCallBody
from fleetserve_runtime.server.sse import DONE

__all__ = [
    "ChatFormat",
    "CompletionFormat",
    "GenerateFormat",
    "oip_failure",
    "openai_failure",
]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def openai_failure(error: Exception, *, prompt_param: str | None = None) -> Failure:
    """`error` in OpenAI's shape; `prompt_param` is named when the prompt was too long.

    `code` is the error's kind in snake case (`queue_full`, `deadline_exceeded`), except
    OpenAI's own `context_length_exceeded`, which clients look for.
    """
    if not isinstance(error, FleetserveError):
        status, param, code = 500, None, "internal_error"
        message = f"internal error (error id {log_unexpected(error)})"
        headers: dict[str, str] = {}
    else:
        status, message = status_of(error, GENERATION_STATUS_OF), error.message
        param = error.param if isinstance(error, InvalidInput) else None
        code = _snake(type(error).__name__)
        if isinstance(error, InputTooLong):
            param, code = prompt_param, "context_length_exceeded"
        headers = error_headers(error)
    body = openai_error(status, message, request_id=request_id(), param=param, code=code)
    return Failure(status, body, headers)


def oip_failure(error: Exception) -> Failure:
    """`error` in the runtime's shape, with the generation routes' statuses."""
    if not isinstance(error, FleetserveError):
        return Failure(500, error_body(f"internal error (error id {log_unexpected(error)})"))
    return failure_of(error, GENERATION_STATUS_OF)


_Delta = TypeVar("_Delta")
"""What one OpenAI stream chunk adds: chat's `delta` object, or completions' `text`."""


@dataclass(frozen=True, slots=True)
class OpenAIFormat(ABC, Generic[_Delta]):
    """What OpenAI's two generation APIs share: the closing chunks and the error shape.

    A subclass says how a chunk looks (`_chunk`), what its delta without text is
    (`_no_text`), which request field a too-long prompt names (`prompt_param`), and what
    its answers' ids start with (`id_prefix`).
    """

    id_: str
    created: int
    model: str
    include_usage: bool
    terminator: bytes = DONE
    choices: int = 1
    """OpenAI's `n`: how many choices the answer has."""
    prompt_param: ClassVar[str]
    id_prefix: ClassVar[str]

    @classmethod
    def answering(cls, model: str, stream_options: StreamOptions | None, n: int = 1) -> Self:
        """The format of one request's answer: a new id, created now, usage as it asks."""
        return cls(
            id_=f"{cls.id_prefix}-{request_id()}",
            created=int(time.time()),
            model=model,
            include_usage=stream_options is not None and stream_options.include_usage,
            choices=n,
        )

    @abstractmethod
    def _chunk(
        self,
        delta: _Delta | None,
        reason: FinishReason | None = None,
        usage: Usage | None = None,
        index: int = 0,
    ) -> object:
        """One chunk of choice `index`; `delta=None` gives the usage-only chunk (no choices)."""

    @abstractmethod
    def _no_text(self) -> _Delta:
        """The delta of a chunk that adds no text (the finish reason's)."""

    def closing(self, finish: FinishEvent) -> list[object]:
        """The finish reason with the usage; with `include_usage`, OpenAI's usage-only chunk.

        OpenAI sends usage only in that extra chunk (choices empty); without it, usage rides
        on the finish chunk, so every stream's last chunk carries the counts. Of an `n` > 1
        answer, only the last choice to finish (`final`) closes with the usage of all.
        """
        ends = self._chunk(self._no_text(), finish.reason, index=finish.index)
        if not finish.final:
            return [ends]
        if self.include_usage:
            return [ends, self._chunk(None, usage=finish.usage)]
        return [self._chunk(self._no_text(), finish.reason, finish.usage, index=finish.index)]

    def failure(self, error: Exception) -> Failure:
        """OpenAI's error shape; a too-long prompt names `prompt_param`."""
        return self.failure_of(error)

    @classmethod
    def failure_of(cls, error: Exception) -> Failure:
        """`failure`, before a format exists (errors while admitting)."""
        return openai_failure(error, prompt_param=cls.prompt_param)


@dataclass(frozen=True, slots=True)
class ChatFormat(OpenAIFormat[dict[str, object]]):
    """`chat.completion` answers and `chat.completion.chunk` streams."""

    prompt_param = "messages"
    id_prefix = "chatcmpl"
    logprobs: bool = False
    """The request asked for log-probabilities: every text chunk carries its tokens'."""
    tools: Toolbox | None = None
    """The request's tools: answers that are calls become `tool_calls` (`openai_tools`)."""
    _held: dict[int, str] = field(default_factory=dict)
    """Streamed text of each choice that may still be a call, held back until it ends."""
    _plain: set[int] = field(default_factory=set)
    """Choices whose answer is known to be text: their deltas go out as they come."""

    def _chunk(
        self,
        delta: dict[str, object] | None,
        reason: FinishReason | None = None,
        usage: Usage | None = None,
        index: int = 0,
        logprobs: ChatLogprobs | None = None,
    ) -> ChatChunk:
        return chat_chunk(
            id_=self.id_,
            created=self.created,
            model=self.model,
            delta=delta,
            reason=reason,
            usage=usage,
            null_usage=self.include_usage,
            logprobs=logprobs,
            index=index,
        )

    def _no_text(self) -> dict[str, object]:
        return {}

    def opening(self) -> list[object]:
        """The assistant's role, with empty content, as OpenAI starts a stream (per choice)."""
        return [
            self._chunk({"role": "assistant", "content": ""}, index=index)
            for index in range(self.choices)
        ]

    def delta(self, event: TokenEvent) -> object | None:
        """A content delta of choice `event.index`, with its tokens' log-probabilities if asked.

        With tools, an answer is held back from its start while it may be a call (blank,
        or opening a JSON value), and goes out whole at its end (`closing`).
        """
        tools, index = self.tools, event.index
        if tools is not None and tools.active and index not in self._plain:
            held = self._held.get(index, "") + event.text
            if not held.strip() or tools.may_call(held):
                self._held[index] = held
                return None
            self._plain.add(index)
            self._held.pop(index, None)
            return self._chunk({"content": held}, index=index)
        if not self.logprobs:
            return self._chunk({"content": event.text}, index=event.index) if event.text else None
        if not (event.text or event.logprobs):
            return None
        logprobs = chat_logprobs(event.logprobs)
        return self._chunk({"content": event.text}, index=event.index, logprobs=logprobs)

    def closing(self, finish: FinishEvent) -> list[object]:
        """A held answer first (its calls, or its text), then the finish as every format's."""
        held = self._held.pop(finish.index, None)
        if held is None:
            return OpenAIFormat.closing(self, finish)
        calls = self._calls(held)
        if calls is None:
            lead = self._chunk({"content": held}, index=finish.index)
            return [lead, *OpenAIFormat.closing(self, finish)]
        deltas = [{"index": n, **call} for n, call in enumerate(calls)]
        lead = self._chunk({"tool_calls": deltas}, index=finish.index)
        called = replace(finish, reason=FinishReason.TOOL_CALLS)
        return [lead, *OpenAIFormat.closing(self, called)]

    def _calls(self, text: str) -> list[ToolCallBody] | None:
        return self.tools.calls(text) if self.tools is not None else None

    def whole(
        self, choices: Sequence[Sequence[TokenEvent]], finishes: Sequence[FinishEvent]
    ) -> ChatCompletion:
        """The non-streamed answer, choice by choice, with usage (and logprobs when asked).

        A choice whose text is calls of the request's tools answers them as `tool_calls`.
        """
        answers = []
        for events, finish in zip(choices, finishes, strict=True):
            text = "".join(event.text for event in events)
            calls = self._calls(text)
            reason = FinishReason.TOOL_CALLS if calls else finish.reason
            answers.append((text, reason, self._logprobs(events), calls))
        return chat_completion(
            id_=self.id_,
            created=self.created,
            model=self.model,
            choices=answers,
            usage=_final(finishes).usage,
        )

    def _logprobs(self, events: Sequence[TokenEvent]) -> ChatLogprobs | None:
        """One choice's `logprobs`: the entries of all its events; None unless asked."""
        if not self.logprobs:
            return None
        return chat_logprobs([entry for event in events for entry in event.logprobs])


@dataclass(frozen=True, slots=True)
class CompletionFormat(OpenAIFormat[str]):
    """`text_completion` answers and streams (the legacy completions API)."""

    prompt_param = "prompt"
    id_prefix = "cmpl"
    logprobs: bool = False
    """The request asked for log-probabilities: every text chunk carries its tokens'."""
    prompt_text: str | None = None
    """With `echo`, a text prompt as sent (OpenAI echoes it verbatim); None: the engine's
    decoding of the prompt's token ids."""
    _offsets: dict[int, int] = field(default_factory=dict)
    """Where the next streamed token starts in each choice's text (`text_offset`), by
    index: the one thing a stream's format changes."""

    def _chunk(
        self,
        delta: str | None,
        reason: FinishReason | None = None,
        usage: Usage | None = None,
        index: int = 0,
        logprobs: CompletionLogprobs | None = None,
    ) -> Completion:
        return completion_chunk(
            id_=self.id_,
            created=self.created,
            model=self.model,
            text=delta,
            reason=reason,
            usage=usage,
            null_usage=self.include_usage,
            logprobs=logprobs,
            index=index,
        )

    def _pieces(self, event: TokenEvent) -> tuple[str, list[tuple[str, TokenLogprob | None]]]:
        """An event's text (the echoed prompt first) and its (token text, entry) pairs."""
        pairs: list[tuple[str, TokenLogprob | None]] = [(e.token, e) for e in event.logprobs]
        prompt = event.prompt
        if prompt is None:
            return event.text, pairs
        text = (prompt.text if self.prompt_text is None else self.prompt_text) + event.text
        if prompt.logprobs is not None:
            scored = [(e.token, e) for e in prompt.logprobs if e is not None]
            pairs = [(prompt.first_token, None), *scored, *pairs]
        return text, pairs

    def _no_text(self) -> str:
        return ""

    def opening(self) -> list[object]:
        """Nothing: completions streams start with text."""
        return []

    def delta(self, event: TokenEvent) -> object | None:
        """A text delta of choice `event.index` (echoed prompt first), logprobs when asked."""
        text, pairs = self._pieces(event)
        if not (text or (self.logprobs and pairs)):
            return None
        if not self.logprobs:
            return self._chunk(text, index=event.index)
        offset = self._offsets.get(event.index, 0)
        self._offsets[event.index] = offset + sum(len(token) for token, _ in pairs)
        return self._chunk(text, index=event.index, logprobs=completion_logprobs(pairs, offset))

    def whole(
        self, choices: Sequence[Sequence[TokenEvent]], finishes: Sequence[FinishEvent]
    ) -> Completion:
        """The non-streamed answer, choice by choice, with usage (and logprobs when asked)."""
        (text, reason, logprobs), *more = [
            self._answer(events, finish) for events, finish in zip(choices, finishes, strict=True)
        ]
        return completion_chunk(
            id_=self.id_,
            created=self.created,
            model=self.model,
            text=text,
            reason=reason,
            usage=_final(finishes).usage,
            logprobs=logprobs,
            more=more,
        )

    def _answer(
        self, events: Sequence[TokenEvent], finish: FinishEvent
    ) -> tuple[str, FinishReason, CompletionLogprobs | None]:
        """One choice of the whole answer: its text, finish reason and `logprobs`."""
        texts: list[str] = []
        pairs: list[tuple[str, TokenLogprob | None]] = []
        for event in events:
            text, more = self._pieces(event)
            texts.append(text)
            pairs.extend(more)
        logprobs = completion_logprobs(pairs, 0) if self.logprobs else None
        return "".join(texts), finish.reason, logprobs


@dataclass(frozen=True, slots=True)
class GenerateFormat:
    """OIP generate answers; `generate_stream` events have the same shape, one per delta."""

    model: str
    version: str
    id_: str | None
    terminator: bytes = b""

    def _body(self, text: str, finish: FinishEvent | None = None) -> GenerateResponse:
        body: GenerateResponse = {
            "model_name": self.model,
            "model_version": self.version,
            "text_output": text,
        }
        if self.id_ is not None:
            body["id"] = self.id_
        if finish is not None:
            body["finish_reason"] = finish.reason.value
            body["usage"] = usage_body(finish.usage)
        return body

    def opening(self) -> list[object]:
        """Nothing: the stream starts with text."""
        return []

    def delta(self, event: TokenEvent) -> object | None:
        """A text delta (OIP generate has one choice); None for an event without text."""
        return self._body(event.text) if event.text else None

    def closing(self, finish: FinishEvent) -> list[object]:
        """An empty last event with the finish reason and usage."""
        return [self._body("", finish)]

    def whole(
        self, choices: Sequence[Sequence[TokenEvent]], finishes: Sequence[FinishEvent]
    ) -> GenerateResponse:
        """The non-streamed answer (of its one choice)."""
        return self._body("".join(event.text for event in choices[0]), finishes[0])

    def failure(self, error: Exception) -> Failure:
        """The runtime's error shape."""
        return oip_failure(error)


def _final(finishes: Sequence[FinishEvent]) -> FinishEvent:
    """The finish of the choice that ended last: its usage counts every choice."""
    return next((finish for finish in finishes if finish.final), finishes[-1])
