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
`sse.GenerationResponse` answer with a `Format` of `generation_formats`. A prompt over the
context is a 400 here (`GENERATION_STATUS_OF`); full queue 503 with `Retry-After`, deadline
504. Every answer counts in `fleetserve_requests_total` like an inference request, under its
final status (see `sse`).

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

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from fastapi import FastAPI, Request, Response

from fleetserve_runtime.core.config_sections import GenerationConfig
from fleetserve_runtime.core.errors import (
    FleetserveError,
    InputTooLong,
    ModelNotFound,
    TooManyStreams,
)
from fleetserve_runtime.core.json_limits import check_depth
from fleetserve_runtime.core.tenants import CURRENT_TENANT
from fleetserve_runtime.generate.contracts import (
    GenerationRequest,
)
from fleetserve_runtime.server.generation_formats import (
    ChatFormat,
    CompletionFormat,
    GenerateFormat,
    oip_failure,
    openai_failure,
)
from fleetserve_runtime.server.generation_schemas import RequestControls
from fleetserve_runtime.server.http_errors import (
    Failure,
    json_response,
    request_id,
)
from fleetserve_runtime.server.model_host import ModelHost
from fleetserve_runtime.server.oip_generate_schemas import (
    GenerateRequest,
    oip_generation,
)
from fleetserve_runtime.server.openai_cache import SemanticAnswers
from fleetserve_runtime.server.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_generation,
    completion_generation,
)
from fleetserve_runtime.server.openai_responses import (
    ModelCard,
    ModelList,
)
from fleetserve_runtime.server.schemas import parse_json, validate_body
from fleetserve_runtime.server.sse import Format, GenerationResponse, StreamLimits
from fleetserve_runtime.serving.admission import Scheduling
from fleetserve_runtime.serving.facade import GenerationEvents

__all__ = [
    "OPENAI_PATHS",
    "RouteHost",
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


class RouteHost(ModelHost, Protocol):
    """What the generation routes take from `inference_routes.Routes` besides a `ModelHost`."""

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

    async def start(self, generation: GenerationRequest, *, cacheable: bool) -> GenerationEvents:
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
