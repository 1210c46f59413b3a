"""The generation routes: OpenAI's chat and completions, and the OIP generate extension.

- `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models[/{id}]`: OpenAI's
  API as its official client speaks it. Every error, also before the route (a bad token,
  an unknown path, a body over the limit), is OpenAI's shape
  `{"error": {"message", "type", "param", "code"}, "request_id"}`; `speaks_openai` tells
  `responses` which paths answer so.
- `POST /v2/models/{name}[/versions/{v}]/generate` and `.../generate_stream`: the OIP
  generate extension (`text_input`, `parameters`; `text_output`), errors in the runtime's
  shape `{"error": message, "request_id"}`.

Both take the same path: read the body (`request_body`'s limits), parse it and bound its
nesting (`json_limits`; a token-id prompt longer than the context is refused here, before it
is converted), validate it (`openai_requests`, `oip_generate_schemas`), admit it
(`ServingFacade.generate`, which raises before any event when it cannot), then let
`sse.GenerationResponse` answer with a `Format` of this module. A prompt over the context is
a 400 here (`GENERATION_STATUS_OF`); full queue 503 with `Retry-After`, deadline 504. Every
answer counts in `fleetserve_requests_total` like an inference request, under its final
status (see `sse`).

With `semantic_cache` on, chat and completions ask `openai_cache.SemanticAnswers` for their
stream instead of the runtime (`_Routes.start`): a greedy request may be answered from an
earlier one's answer, written by the same formats; the OIP generate routes never are.

At most `generation.max_streams` streamed answers are open at once: one more is a 503 with
`Retry-After` (`TooManyStreams`) before it reaches the engine. Per connection there is one:
HTTP/1.1 answers a connection's requests in turn, and uvicorn starts a pipelined request
only once the response before it is complete. (Served over HTTP/2, each connection's
concurrent streams would need a cap of their own, as `SETTINGS_MAX_CONCURRENT_STREAMS`.)
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Generic, Protocol, Self, TypeVar

from fastapi import FastAPI, Request, Response

from fleetserve_runtime.core.config import GenerationConfig
from fleetserve_runtime.core.errors import (
    FleetserveError,
    InputTooLong,
    InvalidInput,
    ModelNotFound,
    TooManyStreams,
)
from fleetserve_runtime.core.json_limits import check_depth
from fleetserve_runtime.core.tenants import CURRENT_TENANT
from fleetserve_runtime.generate.contracts import (
    FinishEvent,
    FinishReason,
    GenerationRequest,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from fleetserve_runtime.server.generation_schemas import RequestControls, usage_body
from fleetserve_runtime.server.http_errors import (
    GENERATION_STATUS_OF,
    Failure,
    error_body,
    error_headers,
    failure_of,
    json_response,
    log_unexpected,
    request_id,
    status_of,
)
from fleetserve_runtime.server.oip_generate_schemas import (
    GenerateRequest,
    GenerateResponse,
    oip_generation,
)
from fleetserve_runtime.server.openai_cache import SemanticAnswers
from fleetserve_runtime.server.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    chat_generation,
    completion_generation,
)
from fleetserve_runtime.server.openai_responses import (
    ChatChunk,
    ChatCompletion,
    ChatLogprobs,
    Completion,
    CompletionLogprobs,
    ModelCard,
    ModelList,
    chat_chunk,
    chat_completion,
    chat_logprobs,
    completion_chunk,
    completion_logprobs,
    openai_error,
)
from fleetserve_runtime.server.openai_tools import Toolbox, ToolCallBody
from fleetserve_runtime.server.schemas import parse_json, validate_body
from fleetserve_runtime.server.sse import DONE, Format, GenerationResponse, StreamLimits
from fleetserve_runtime.serving.admission import Scheduling
from fleetserve_runtime.serving.facade import GenerationStream, ServingFacade

__all__ = [
    "OPENAI_PATHS",
    "RouteHost",
    "openai_failure",
    "oip_failure",
    "register_generation",
    "speaks_openai",
]

OPENAI_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
    }
)
"""OpenAI's routes (`/v1/embeddings` is `embeddings'`, vLLM's `/tokenize` and `/detokenize`
`tokenize_routes'`); `/v1/models/{id}` too (but not KServe's `/v1/models/{name}:predict`)."""
OWNER = "fleetserve"
STREAM_RETRY_AFTER_S = 1.0
"""`Retry-After` of a stream refused at `generation.max_streams`: a slot frees whenever any
stream ends, so there is no better estimate."""


def speaks_openai(path: str) -> bool:
    """Whether errors on `path` take OpenAI's shape."""
    return path in OPENAI_PATHS or (path.startswith("/v1/models/") and ":" not in path)


class RouteHost(Protocol):
    """What the generation routes take from `inference_routes.Routes`: runtime, limits, metrics."""

    @property
    def rt(self) -> ServingFacade:
        """The runtime (`ModelNotReady` while the server starts)."""
        ...

    def check_name(self, name: str) -> None:
        """`ModelNotFound` unless `name` is the served model's name."""
        ...

    async def body(self, request: Request) -> bytes:
        """The JSON body, read under the media type, size and time limits."""
        ...

    @property
    def name(self) -> str:
        """The served model's name."""
        ...

    @property
    def generation(self) -> GenerationConfig:
        """The generation settings: output-token default and cap, streaming bounds."""
        ...

    def scheduling(
        self,
        request: Request,
        priority: str | None,
        timeout_ms: int | None,
        *,
        default_timeout_ms: int | None = None,
    ) -> Scheduling:
        """Priority and timeout (ms): the `X-Fleetserve-*` headers, else these values.

        Raising either above the defaults needs the priority token (`serving.admission`).
        """
        ...

    def count(self, version: str | None, code: int, seconds: float) -> None:
        """Count one answered request in the request metrics."""
        ...


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
class _OpenAIFormat(ABC, Generic[_Delta]):
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
class ChatFormat(_OpenAIFormat[dict[str, object]]):
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
            return _OpenAIFormat.closing(self, finish)
        calls = self._calls(held)
        if calls is None:
            lead = self._chunk({"content": held}, index=finish.index)
            return [lead, *_OpenAIFormat.closing(self, finish)]
        deltas = [{"index": n, **call} for n, call in enumerate(calls)]
        lead = self._chunk({"tool_calls": deltas}, index=finish.index)
        called = replace(finish, reason=FinishReason.TOOL_CALLS)
        return [lead, *_OpenAIFormat.closing(self, called)]

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
class CompletionFormat(_OpenAIFormat[str]):
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


def _check_token_ids(data: object, context_length: int) -> None:
    """`InputTooLong` for a token-id `prompt` longer than the context, before it is converted.

    Validating a list of a million ints into the schema, then into the engine's tuple, costs
    far more than counting it; a prompt that cannot fit is refused first.
    """
    prompt = data.get("prompt") if isinstance(data, dict) else None
    if not isinstance(prompt, list) or not prompt:
        return
    rows = (
        [prompt] if isinstance(prompt[0], int) else [row for row in prompt if isinstance(row, list)]
    )
    longest = max((len(row) for row in rows), default=0)
    if longest > context_length:
        msg = (
            f"prompt of {longest} token ids cannot fit the model's context of "
            f"{context_length} tokens"
        )
        raise InputTooLong(msg)


Admit = Callable[[], Awaitable[tuple[GenerationRequest, Format, bool]]]
"""Reads and validates one request: the generation, how to write it, whether to stream."""


class _Routes:
    """The route bodies; `host` is the inference routes' side of them."""

    def __init__(self, host: RouteHost, answers: SemanticAnswers | None) -> None:
        self.host = host
        self.answers = answers
        """The semantic cache of the OpenAI routes; None when it is off."""
        self.started_at = int(time.time())
        self.open_streams = 0
        """Streamed answers admitted and not over, against `generation.max_streams`."""

    async def answer(
        self,
        version: str | None,
        admit: Admit,
        fail: Callable[[Exception], Failure],
        *,
        cacheable: bool = False,
    ) -> Response:
        """Admit the request and answer it; errors before admission are answered by `fail`.

        `cacheable`: the semantic cache, when on, may answer it (the OpenAI routes).
        """
        started = time.perf_counter()
        streaming = False
        try:
            generation, fmt, streaming = await admit()
            if streaming:
                self.open_stream()
            try:
                stream = await self.start(generation, cacheable=cacheable)
            except BaseException:
                if streaming:
                    self.open_streams -= 1
                raise
        except Exception as error:  # domain errors, and bugs answered as a 500 with an error id
            failure = fail(error)
            self.host.count(version, failure.status, time.perf_counter() - started)
            return failure.response()

        def on_done(code: int) -> None:
            if streaming:
                self.open_streams -= 1
            self.host.count(version, code, time.perf_counter() - started)

        settings = self.host.generation
        return GenerationResponse(
            stream,
            fmt,
            streaming=streaming,
            limits=StreamLimits(settings.stream_send_timeout_s, settings.stream_buffer_bytes),
            on_done=on_done,
            on_cut=self.host.rt.metrics.observe_stream_limit,
        )

    async def start(self, generation: GenerationRequest, *, cacheable: bool) -> GenerationStream:
        """The generation's stream: from the semantic cache where it may answer, else the engine.

        The cache's entries are the request's tenant's (`CURRENT_TENANT`, set by the edge's
        tenancy middleware); without a tenants table, the untenanted partition (None).
        """
        if cacheable and self.answers is not None:
            tenant = CURRENT_TENANT.get()
            name = None if tenant is None else tenant.name
            return await self.answers.generate(self.host.rt, generation, tenant=name)
        return await self.host.rt.generate(generation)

    def open_stream(self) -> None:
        """Count one more open stream; `TooManyStreams` at `generation.max_streams`."""
        cap = self.host.generation.max_streams
        if self.open_streams >= cap:
            self.host.rt.metrics.observe_stream_limit("max_streams")
            msg = (
                f"{self.open_streams} streams are open, the most this server serves at once "
                f"(generation.max_streams); retry after {STREAM_RETRY_AFTER_S:g}s"
            )
            raise TooManyStreams(msg, retry_after_s=STREAM_RETRY_AFTER_S)
        self.open_streams += 1

    def controls(
        self, request: Request, priority: str | None = None, timeout_ms: int | None = None
    ) -> RequestControls:
        granted = self.host.scheduling(
            request,
            priority,
            timeout_ms,
            default_timeout_ms=self.host.generation.default_timeout_ms,
        )
        return RequestControls(
            priority=granted.priority,
            timeout_s=None if granted.timeout_ms is None else granted.timeout_ms / 1000,
            request_id=request_id(),
        )

    async def parsed(self, request: Request) -> object:
        """The body's JSON, its nesting bounded before any schema (or `repr`) walks it."""
        data = parse_json(await self.host.body(request))
        check_depth(data)
        return data

    async def chat(self, request: Request) -> Response:
        async def admit() -> tuple[GenerationRequest, Format, bool]:
            body = validate_body(await self.parsed(request), ChatCompletionRequest)
            self.host.check_name(body.model)
            generation = chat_generation(
                body, controls=self.controls(request), limits=self.host.generation
            )
            fmt = replace(
                ChatFormat.answering(body.model, body.stream_options, generation.n),
                logprobs=bool(body.logprobs),
                tools=body.toolbox(),
            )
            return generation, fmt, body.stream

        return await self.answer(None, admit, ChatFormat.failure_of, cacheable=True)

    async def completions(self, request: Request) -> Response:
        async def admit() -> tuple[GenerationRequest, Format, bool]:
            data = await self.parsed(request)
            _check_token_ids(data, self.host.rt.generation_info().context_length)
            body = validate_body(data, CompletionRequest)
            self.host.check_name(body.model)
            generation = completion_generation(
                body, controls=self.controls(request), limits=self.host.generation
            )
            fmt = replace(
                CompletionFormat.answering(body.model, body.stream_options, generation.n),
                logprobs=body.logprobs is not None,
                prompt_text=generation.prompt if body.echo else None,
            )
            return generation, fmt, body.stream

        return await self.answer(None, admit, CompletionFormat.failure_of, cacheable=True)

    async def generate(
        self, request: Request, name: str, version: str | None, *, streaming: bool
    ) -> Response:
        async def admit() -> tuple[GenerationRequest, Format, bool]:
            self.host.check_name(name)
            body = validate_body(await self.parsed(request), GenerateRequest)
            params = body.parameters
            info = self.host.rt.generation_info()
            generation = oip_generation(
                body,
                controls=self.controls(request, params.priority, params.timeout_ms),
                limits=self.host.generation,
                version=version,
            )
            fmt = GenerateFormat(model=name, version=version or info.version, id_=body.id)
            return generation, fmt, streaming

        return await self.answer(version, admit, oip_failure)

    def cards(self) -> list[ModelCard]:
        """The served model, when it generates."""
        if not self.host.rt.is_generative:
            return []
        card: ModelCard = {
            "id": self.host.name,
            "object": "model",
            "created": self.started_at,
            "owned_by": OWNER,
        }
        return [card]

    def models(self) -> Response:
        try:
            listing: ModelList = {"object": "list", "data": self.cards()}
        except FleetserveError as error:
            return openai_failure(error).response()
        return json_response(listing)

    def model(self, model: str) -> Response:
        try:
            self.host.check_name(model)
            cards = self.cards()
            if not cards:
                msg = f"model {model!r} does not generate text"
                raise ModelNotFound(msg)
        except FleetserveError as error:
            return openai_failure(error).response()
        return json_response(cards[0])


def register_generation(
    app: FastAPI, host: RouteHost, answers: SemanticAnswers | None = None
) -> None:
    """Mount the generation routes on `app`; `answers`: the OpenAI routes' semantic cache."""
    routes = _Routes(host, answers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await routes.chat(request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await routes.completions(request)

    @app.get("/v1/models")
    async def list_models() -> Response:
        return routes.models()

    @app.get("/v1/models/{model}")
    async def retrieve_model(model: str) -> Response:
        return routes.model(model)

    @app.post("/v2/models/{name}/generate")
    async def generate(request: Request, name: str) -> Response:
        return await routes.generate(request, name, None, streaming=False)

    @app.post("/v2/models/{name}/versions/{version}/generate")
    async def generate_version(request: Request, name: str, version: str) -> Response:
        return await routes.generate(request, name, version, streaming=False)

    @app.post("/v2/models/{name}/generate_stream")
    async def generate_stream(request: Request, name: str) -> Response:
        return await routes.generate(request, name, None, streaming=True)

    @app.post("/v2/models/{name}/versions/{version}/generate_stream")
    async def generate_stream_version(request: Request, name: str, version: str) -> Response:
        return await routes.generate(request, name, version, streaming=True)
