"""HTTP API: Open Inference Protocol v2 routes, KServe v1 predict, health, metrics, model control.

The edge's assembly, with `http_errors`, and `generation` and `sse` for the generation
routes (OpenAI's API, OIP generate) it mounts. Routes parse and
delegate to the runtime through `serving.facade.ServingFacade` (never to its registry, queue or
engine); every domain error becomes a JSON body `{"error": ..., "request_id": ...}` through
`http_errors.STATUS_OF`, the one error → status table. Bodies must be `application/json`
(or, on the v2 infer routes, in the binary tensor data extension: `binary_tensors`), are
read with a byte limit and a deadline, and are decoded in time linear in their size
(`schemas` checks declared shapes before touching data), so no bad input reaches the model,
produces a 500 or stalls the event loop for longer than parsing `max_body_bytes` takes.

Two ASGI apps share one `Runtime` (see `create_apps`):

- the inference app: health, metadata, inference and metrics, behind an optional bearer
  token (`auth_token_file`; probes and metrics exempt);
- the admin app, only with `model_control: explicit`: the repository load/unload API, always
  behind its own bearer token (`admin_token_file`) and the `allowed_model_uris` allowlist.

`listener_app` sends each connection to one of them by the local port it arrived on; the CLI
runs one uvicorn server with a socket per listener, so both live in one process, one event
loop and one lifespan. Every request gets a request id (its `X-Request-ID`, or a new one)
bound to its log records and returned in its response. With `grpc_port` set, that lifespan
also runs the OIP gRPC server (`grpc_api`) on the same loop, over the same runtime.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetserve_runtime import __version__
from fleetserve_runtime.core.auth import TokenFile, bearer_token, token_matches, uri_refusal
from fleetserve_runtime.core.config import GenerationConfig, RuntimeConfig
from fleetserve_runtime.core.errors import (
    FleetserveError,
    Forbidden,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    UnsupportedMediaType,
)
from fleetserve_runtime.core.liveness import Liveness
from fleetserve_runtime.core.logs import (
    RequestContext,
    bind_request,
    request_id_from,
    traceparent_from,
    unbind_request,
)
from fleetserve_runtime.encoder.engine import InferenceCall, InferenceResult
from fleetserve_runtime.models.base import TensorSpec
from fleetserve_runtime.server.binary_tensors import (
    attach_binary_inputs,
    encode_tensor,
    join_binary_body,
    split_binary_body,
    stack_results,
    wants_binary_output,
)
from fleetserve_runtime.server.generation import openai_failure, register_generation, speaks_openai
from fleetserve_runtime.server.generation_schemas import openai_error
from fleetserve_runtime.server.http_errors import (
    STATUS_OF,
    error_body,
    failure_of,
    json_response,
    log_unexpected,
    request_id,
)
from fleetserve_runtime.server.schemas import (
    InferenceRequest,
    LoadRequest,
    RequestParameters,
    TensorLimits,
    V1Request,
    check_instances,
    decode_body,
    tensor_instances,
    validate_body,
)
from fleetserve_runtime.serving.admission import (
    PRIORITY_HEADER,
    TIMEOUT_HEADER,
    Scheduling,
    scheduling,
)
from fleetserve_runtime.serving.facade import ServingFacade
from fleetserve_runtime.serving.runtime import Runtime

__all__ = ["STATUS_OF", "Apps", "create_app", "create_apps", "json_media_refusal", "listener_app"]

log = logging.getLogger("fleetserve.api")

BINARY_TENSOR_HEADER = "inference-header-content-length"
"""Marks a request (or response) in the OIP binary tensor data extension (`binary_tensors`)."""


def _error(
    status: int,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    path: str = "",
    **extra: Any,
) -> Response:
    """An error answer; on OpenAI's paths in OpenAI's shape (`extra` is then dropped)."""
    if speaks_openai(path):
        body = openai_error(status, message, request_id=request_id(), param=None, code=None)
        return json_response(body, status, headers)
    return json_response(error_body(message, **extra), status, headers)


def _error_response(exc: FleetserveError, path: str = "") -> Response:
    """A domain error's answer; on OpenAI's paths in OpenAI's shape."""
    return (openai_failure(exc) if speaks_openai(path) else failure_of(exc)).response()


def _unexpected() -> Response:
    """A 500 for a bug: an id to find the traceback in the log, never the traceback itself."""
    return _error(500, f"internal error (error id {log_unexpected()})")


def json_media_refusal(
    content_type: str | None, *, binary_extension: bool, missing_is_json: bool = False
) -> str | None:
    """Why a body with this `Content-Type` is not accepted as JSON, or None when it is.

    Only `application/json` (UTF-8) is: HTML forms cannot send it without a CORS preflight,
    so a cross-site form post never reaches a model. With `missing_is_json` (the inference
    routes), a body without any `Content-Type` is JSON too: NVIDIA's `tritonclient.http` in
    JSON mode sends none, and Triton takes it. The media types a browser may send cross-site
    without a preflight (`text/plain`, forms) stay refused.
    """
    if binary_extension:
        return (
            "the binary tensor data extension (Inference-Header-Content-Length) is accepted "
            "on the v2 infer routes only; send JSON with Content-Type: application/json"
        )
    if content_type is None and missing_is_json:
        return None
    media, _, parameters = (content_type or "").partition(";")
    if media.strip().lower() != "application/json":
        shown = media.strip()[:80] or "none"
        return f"Content-Type must be application/json, got {shown!r}"
    for parameter in parameters.split(";"):
        key, _, value = parameter.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() != "utf-8":
            return "JSON bodies must be UTF-8 (charset=utf-8)"
    return None


def _require_json(request: Request, *, missing_is_json: bool) -> None:
    refusal = json_media_refusal(
        request.headers.get("content-type"),
        binary_extension=BINARY_TENSOR_HEADER in request.headers,
        missing_is_json=missing_is_json,
    )
    if refusal is not None:
        raise UnsupportedMediaType(refusal)


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        msg = f"request body of {declared} bytes exceeds the limit of {limit} bytes"
        raise PayloadTooLarge(msg)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    msg = f"request body exceeds the limit of {limit} bytes"
                    raise PayloadTooLarge(msg)
                chunks.append(chunk)
    except TimeoutError:
        msg = f"request body not received within {timeout_s:g} s (body_timeout_s)"
        raise RequestTimeout(msg) from None
    except ClientDisconnect:
        msg = "the client disconnected before sending the whole body"
        raise InvalidInput(msg) from None
    return b"".join(chunks)


def _call(
    instances: list[object],
    version: str | None,
    params: RequestParameters | None,
    granted: Scheduling,
) -> InferenceCall:
    truncate = params is not None and params.truncate
    return InferenceCall(instances, version, granted.priority, granted.timeout_ms, truncate)


def _timing_headers(result: InferenceResult, total_s: float) -> dict[str, str]:
    t = result.timings
    server_timing = (
        f"queue;dur={t.queue_s * 1000:.3f}, batch;dur={t.batch_s * 1000:.3f}, "
        f"compute;dur={t.compute_s * 1000:.3f}, total;dur={total_s * 1000:.3f}"
    )
    return {"server-timing": server_timing, "x-fleetserve-batch-size": str(t.batch_size)}


def _tensor_meta(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


class _Routes:
    """Route bodies; `runtime` is set by the lifespan and used only as a `ServingFacade`."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.limits = TensorLimits(
            max_rank=config.max_tensor_rank,
            max_elements=config.max_tensor_elements,
            max_instances=config.max_instances,
        )
        self.runtime: ServingFacade | None = None
        self.priority_token = (
            TokenFile(config.priority_token_file)
            if config.priority_token_file is not None
            else None
        )

    @property
    def rt(self) -> ServingFacade:
        if self.runtime is None:
            msg = "server is starting"
            raise ModelNotReady(msg)
        return self.runtime

    def check_name(self, name: str) -> None:
        if name != self.config.name:
            msg = f"model {name!r} is not served here (this server serves {self.config.name!r})"
            raise ModelNotFound(msg)

    async def body(self, request: Request, *, missing_is_json: bool = False) -> bytes:
        """The request's JSON body, unparsed: media type, size and deadline checked.

        `missing_is_json` takes a body without `Content-Type` as JSON (`json_media_refusal`):
        the OIP and KServe inference routes do, as Triton does; generation and model control
        keep requiring `application/json`.
        """
        _require_json(request, missing_is_json=missing_is_json)
        return await _read_body(
            request, self.config.max_body_bytes, self.config.http.body_timeout_s
        )

    async def infer_body(self, request: Request) -> bytes:
        """The v2 infer body, unparsed: JSON, or in the binary tensor data extension.

        A binary body needs no JSON media type: its `Inference-Header-Content-Length`
        header already makes a browser ask for a CORS preflight, as `application/json` does.
        """
        if BINARY_TENSOR_HEADER not in request.headers:
            return await self.body(request, missing_is_json=True)
        return await _read_body(
            request, self.config.max_body_bytes, self.config.http.body_timeout_s
        )

    def inference_request(self, request: Request, raw: bytes) -> InferenceRequest:
        """Decode what `infer_body` read."""
        header_length = request.headers.get(BINARY_TENSOR_HEADER)
        if header_length is None:
            return decode_body(raw, InferenceRequest)
        header, tail = split_binary_body(raw, header_length)
        attach_binary_inputs(header, tail, self.limits)
        return validate_body(header, InferenceRequest)

    async def observed(
        self, version: str | None, run: Callable[[], Awaitable[Response]]
    ) -> Response:
        """Run `run()`, map domain errors, and count the answer in the metrics."""
        started = time.perf_counter()
        try:
            response = await run()
        except FleetserveError as exc:
            response = _error_response(exc)
        except Exception:
            # Nothing should get here; if something does, it is answered (and counted, so a
            # canary's analysis sees it) like any other server error, with an id to find it.
            response = _unexpected()
        self.count(version, response.status_code, time.perf_counter() - started)
        return response

    def count(self, version: str | None, code: int, seconds: float) -> None:
        """Count one answered request (of `version`, or the active one) in the metrics."""
        if self.runtime is not None:
            self.runtime.metrics.observe_request(self._version_label(version), code, seconds)

    @property
    def name(self) -> str:
        """The served model's name."""
        return self.config.name

    @property
    def generation(self) -> GenerationConfig:
        """The generation settings (output-token defaults and caps, streaming bounds)."""
        return self.config.generation

    def privileged(self, request: Request) -> bool:
        """Whether `request` bears the priority token (`priority_token_file`)."""
        if self.priority_token is None:
            return False
        presented = bearer_token(request.headers.get("authorization"))
        return token_matches(presented, self.priority_token.current())

    def scheduling(
        self,
        request: Request,
        priority: str | None,
        timeout_ms: int | None,
        *,
        default_timeout_ms: int | None = None,
    ) -> Scheduling:
        """Priority and timeout (ms) of a request: its headers, else these values.

        Raising either above the defaults needs the priority token (`serving.admission`);
        the default timeout is the encoder queue's unless `default_timeout_ms` says otherwise.
        """
        headers = request.headers
        return scheduling(
            priority_header=headers.get(PRIORITY_HEADER),
            timeout_header=headers.get(TIMEOUT_HEADER),
            priority=priority,
            timeout_ms=timeout_ms,
            default_timeout_ms=default_timeout_ms or self.config.queue.default_timeout_ms,
            privileged=self.privileged(request),
        )

    def _granted(self, request: Request, params: RequestParameters | None) -> Scheduling:
        if params is None:
            return self.scheduling(request, None, None)
        return self.scheduling(request, params.priority, params.timeout_ms)

    def _version_label(self, version: str | None) -> str:
        """The metrics label: the loaded version asked for, else the active one.

        Versions that are not loaded share one label, so callers cannot mint series.
        """
        if version is not None:
            return version if version in self.rt.versions() else "unknown"
        return self.rt.active_version or "none"

    async def infer_v2(self, request: Request, name: str, version: str | None) -> Response:
        async def run() -> Response:
            self.check_name(name)
            raw = await self.infer_body(request)
            model = self.rt.model(version)
            spec_in, spec_out = model.handler.metadata.inputs[0], model.handler.metadata.outputs[0]
            body = self.inference_request(request, raw)
            instances = tensor_instances(
                body.inputs[0],
                expected_name=spec_in.name,
                expected_datatype=spec_in.datatype,
                limits=self.limits,
            )
            started = time.perf_counter()
            granted = self._granted(request, body.parameters)
            result = await self.rt.infer(_call(instances, version, body.parameters, granted))
            data, shape = stack_results(result.results)
            output: dict[str, Any] = {
                "name": spec_out.name,
                "datatype": spec_out.datatype,
                "shape": shape,
            }
            payload = {
                "model_name": name,
                "model_version": result.model.version,
                "id": body.id or request_id(),
                "outputs": [output],
            }
            headers = _timing_headers(result, time.perf_counter() - started)
            # `binary_data_output` is no field of ours: pydantic keeps it among the extras.
            parameters = (body.parameters.model_extra or {}) if body.parameters else {}
            if not wants_binary_output(body.outputs, parameters, spec_out.name):
                return json_response(
                    {**payload, "outputs": [{**output, "data": data}]}, headers=headers
                )
            tensor = encode_tensor(data, spec_out.datatype)
            output["parameters"] = {"binary_data_size": len(tensor)}
            content, header_length = join_binary_body(payload, [tensor])
            headers[BINARY_TENSOR_HEADER] = str(header_length)
            return Response(content, media_type="application/octet-stream", headers=headers)

        return await self.observed(version, run)

    async def predict_v1(self, request: Request, name: str) -> Response:
        async def run() -> Response:
            self.check_name(name)
            raw = await self.body(request, missing_is_json=True)
            body = decode_body(raw, V1Request)
            check_instances(body.instances, self.limits)
            started = time.perf_counter()
            granted = self._granted(request, body.parameters)
            result = await self.rt.infer(_call(body.instances, None, body.parameters, granted))
            headers = _timing_headers(result, time.perf_counter() - started)
            return json_response({"predictions": result.results}, headers=headers)

        return await self.observed(None, run)

    def metadata(self, name: str, version: str | None) -> dict[str, Any]:
        self.check_name(name)
        model = self.rt.model(version)
        meta = model.metadata
        return {
            "name": meta.name,
            "versions": self.rt.versions(),
            "platform": meta.platform,
            "inputs": [_tensor_meta(t) for t in meta.inputs],
            "outputs": [_tensor_meta(t) for t in meta.outputs],
            "parameters": {
                "active_version": self.rt.active_version,
                "max_sequence_length": meta.max_sequence_length,
                **self.rt.describe(model),
            },
        }  # fmt: skip

    def liveness(self) -> Liveness:
        # A runtime still starting is alive: restarting it would only start it again.
        return self.runtime.liveness() if self.runtime is not None else Liveness(ok=True)


# -- middleware ----------------------------------------------------------------------------


class _IndexedHeaders(Headers):
    """Starlette's request headers, looked up in a dict.

    Starlette scans the header list on every look-up, and raises and catches a `KeyError`
    for each absent one; the infer routes ask for about eight headers, most of them absent.
    As in Starlette, the first of repeated headers is the one found.
    """

    def __init__(self, scope: Scope) -> None:
        super().__init__(scope=scope)
        index: dict[bytes, bytes] = {}
        for key, value in self.raw:
            index.setdefault(key, value)
        self._index = index

    def get(self, key: str, default: Any = None) -> Any:
        """The header's value, or `default` when absent."""
        value = self._index.get(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def __getitem__(self, key: str) -> str:
        value = self._index.get(key.lower().encode("latin-1"))
        if value is None:
            raise KeyError(key)
        return value.decode("latin-1")

    def __contains__(self, key: Any) -> bool:
        return isinstance(key, str) and key.lower().encode("latin-1") in self._index


class _InferRequest(Request):
    """The `Request` the infer fast path hands its route: headers looked up in a dict."""

    @property
    def headers(self) -> Headers:
        """The request's headers, indexed once."""
        headers = self.__dict__.get("_indexed_headers")
        if headers is None:
            headers = self.__dict__["_indexed_headers"] = _IndexedHeaders(self.scope)
        return headers


class _RequestContextMiddleware:
    """Binds each request's ids to its log records and returns them as `X-Request-ID`.

    An exception that escaped the routes becomes a JSON 500 here; the traceback goes to the
    log only.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _IndexedHeaders(scope)
        context = RequestContext(
            request_id=request_id_from(headers.get("x-request-id")),
            traceparent=traceparent_from(headers.get("traceparent")),
        )
        token = bind_request(context)
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["x-request-id"] = context.request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if status:
                raise
            await _unexpected()(scope, receive, send_with_id)
        finally:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "request",
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    },
                )
            unbind_request(token)


def _infer_target(path: str) -> tuple[str, str | None] | None:
    """(name, version) of a v2 infer path, as the routes' `{name}` and `{version}` match."""
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[3] and parts[4] == "infer":
        return parts[3], None
    if (
        len(parts) == 7
        and parts[:3] == ["", "v2", "models"]
        and parts[3]
        and parts[4] == "versions"
        and parts[5]
        and parts[6] == "infer"
    ):
        return parts[3], parts[5]
    return None


class _InferFastPath:
    """Sends `POST` to a v2 infer path straight to its route body, past FastAPI's router.

    These are the requests that arrive thousands of times a second, and at zero model cost
    FastAPI's route scan, parameter solving and exception wrappers cost about as much as
    the route itself (profiled). The route body maps every error to its answer itself
    (`_Routes.observed`), so nothing is lost; other methods and paths go on to FastAPI.
    The innermost middleware: request ids and bearer tokens apply as to any route.
    """

    def __init__(self, app: ASGIApp, *, routes: _Routes) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = (
            _infer_target(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if target is None:
            await self.app(scope, receive, send)
            return
        response = await self.routes.infer_v2(_InferRequest(scope, receive), *target)
        await response(scope, receive, send)


class _BearerAuthMiddleware:
    """401 with `WWW-Authenticate: Bearer` unless the request carries one of the files' tokens.

    The inference listener takes the inference token or the priority token (whoever may
    raise priority may also infer); the admin listener only the admin token.
    """

    def __init__(
        self, app: ASGIApp, *, tokens: tuple[TokenFile, ...], exempt: frozenset[str]
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        presented = bearer_token(Headers(scope=scope).get("authorization"))
        if any(token_matches(presented, token.current()) for token in self.tokens):
            await self.app(scope, receive, send)
            return
        if presented is None:
            refusal = Unauthorized(
                "a bearer token is required", challenge='Bearer realm="fleetserve"'
            )
        else:
            refusal = Unauthorized(
                "the bearer token is not valid",
                challenge='Bearer realm="fleetserve", error="invalid_token"',
            )
        await _error_response(refusal, scope["path"])(scope, receive, send)


# -- apps ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Apps:
    """The inference app and, with `model_control: explicit`, the admin app; one runtime."""

    inference: FastAPI
    admin: FastAPI | None


async def _watch_first_load(
    runtime: Runtime,
    on_load_failure: Callable[[BaseException], None] | None,
    on_ready: Callable[[], object] | None,
) -> None:
    try:
        await runtime.wait_ready()
    except Exception as exc:  # any failure of the first load is fatal to the process
        if on_load_failure is not None:
            on_load_failure(exc)
        return
    if on_ready is not None:
        on_ready()


async def _serve_grpc(routes: _Routes, config: RuntimeConfig) -> Callable[[], Awaitable[None]]:
    # Imported only when gRPC is on: its generated code claims protobuf's `inference.*` names,
    # which a test process using tritonclient.grpc holds already.
    from fleetserve_runtime.server.grpc_api import serve_grpc

    return await serve_grpc(routes, config, server_version=__version__)


def _telemetry(config: RuntimeConfig) -> TelemetryConfig:
    """FastAPI's native OpenTelemetry settings: its defaults, or every signal off."""
    if config.http.opentelemetry:
        return {}
    return {"tracing": False, "metrics": False, "logs": False}


def create_apps(
    config: RuntimeConfig,
    *,
    on_load_failure: Callable[[BaseException], None] | None = None,
    on_ready: Callable[[], object] | None = None,
) -> Apps:
    """Build both apps; the runtime starts in the inference app's lifespan.

    `on_load_failure` is called once if the first model load fails; the CLI stops the
    server then, so a pod whose model cannot load crashes (and says why) instead of
    staying unready until a deadline notices. `on_ready` is called once the first load
    succeeded (the CLI freezes the heap then: `cli.main`).
    """
    routes = _Routes(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(config)
        routes.runtime = runtime
        app.state.runtime = runtime
        await runtime.start()
        watcher = (
            asyncio.create_task(_watch_first_load(runtime, on_load_failure, on_ready))
            if on_load_failure is not None or on_ready is not None
            else None
        )
        stop_grpc = None
        try:
            if config.grpc_port is not None:
                stop_grpc = await _serve_grpc(routes, config)
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            if stop_grpc is not None:
                await stop_grpc()
            await runtime.stop()

    inference_auth = (
        [
            Middleware(
                _BearerAuthMiddleware,
                tokens=(
                    TokenFile(config.auth_token_file),
                    *([routes.priority_token] if routes.priority_token is not None else []),
                ),
                exempt=frozenset(config.auth_exempt_paths),
            )
        ]
        if config.auth_token_file is not None
        else []
    )
    docs = config.http.api_docs
    telemetry = _telemetry(config)
    inference = FastAPI(
        title="fleetserve-runtime",
        version=__version__,
        lifespan=lifespan,
        telemetry=telemetry,
        docs_url="/docs" if docs else None,
        redoc_url=None,
        openapi_url="/openapi.json" if docs else None,
        middleware=[
            Middleware(_RequestContextMiddleware),
            *inference_auth,
            Middleware(_InferFastPath, routes=routes),
        ],
    )
    _register_errors(inference)
    _register_health(inference, routes)
    _register_inference(inference, routes)
    register_generation(inference, routes)
    admin = None
    if config.model_control == "explicit" and config.admin_token_file is not None:
        admin = FastAPI(
            title="fleetserve-runtime model control",
            version=__version__,
            telemetry=telemetry,
            docs_url=None,
            redoc_url=None,
            openapi_url=None,
            middleware=[
                Middleware(_RequestContextMiddleware),
                Middleware(
                    _BearerAuthMiddleware,
                    tokens=(TokenFile(config.admin_token_file),),
                    exempt=frozenset(),
                ),
            ],
        )
        _register_errors(admin)
        _register_repository(admin, routes)
    return Apps(inference=inference, admin=admin)


def create_app(config: RuntimeConfig) -> FastAPI:
    """The inference app alone (health, metadata, inference, metrics); see `create_apps`."""
    return create_apps(config).inference


def listener_app(apps: Apps, *, admin_port: int | None) -> ASGIApp:
    """One ASGI app for the server: connections to `admin_port` reach the admin app.

    The local port a connection arrived on is set by the kernel, so no header can steer a
    request from the inference listener to the admin app. Lifespan events go to the
    inference app, which owns the runtime.
    """
    if apps.admin is None or admin_port is None:
        return apps.inference
    admin, inference = apps.admin, apps.inference

    async def by_listener(scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == admin_port:
            await admin(scope, receive, send)
        else:
            await inference(scope, receive, send)

    return by_listener


def _register_errors(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        return _error(exc.status_code, str(exc.detail), headers=headers, path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"]) or "request"
        return _error(400, f"{where}: {first['msg']}", path=request.url.path)

    @app.exception_handler(FleetserveError)
    async def domain_error(request: Request, exc: FleetserveError) -> Response:
        return _error_response(exc, request.url.path)


def _register_health(app: FastAPI, routes: _Routes) -> None:
    extensions = ["model_repository"] if routes.config.model_control == "explicit" else []

    @app.get("/v2")
    async def server_metadata() -> Response:
        body = {"name": "fleetserve-runtime", "version": __version__, "extensions": extensions}
        return json_response(body)

    @app.get("/v2/health/live")
    async def live() -> Response:
        verdict = routes.liveness()
        if verdict.ok:
            return json_response({"live": True})
        return json_response({"live": False, "reason": verdict.reason}, 503)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        runtime = routes.runtime
        if runtime is not None and runtime.is_ready:
            return json_response({"ready": True})
        failure = runtime.load_failed if runtime is not None else None
        body: dict[str, Any] = {"ready": False}
        if failure is not None:
            body["error"] = f"model load failed: {failure}"
        return json_response(body, 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(routes.rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _register_inference(app: FastAPI, routes: _Routes) -> None:
    @app.get("/v2/models/{name}")
    async def model_metadata(name: str) -> Response:
        return json_response(routes.metadata(name, None))

    @app.get("/v2/models/{name}/versions/{version}")
    async def version_metadata(name: str, version: str) -> Response:
        return json_response(routes.metadata(name, version))

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> Response:
        routes.check_name(name)
        ok = routes.rt.active_version is not None
        return json_response({"name": name, "ready": ok}, 200 if ok else 503)

    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def version_ready(name: str, version: str) -> Response:
        routes.check_name(name)
        ok = version in routes.rt.versions()
        return json_response({"name": name, "version": version, "ready": ok}, 200 if ok else 503)

    @app.post("/v2/models/{name}/infer")
    async def infer(request: Request, name: str) -> Response:
        return await routes.infer_v2(request, name, None)

    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer_version(request: Request, name: str, version: str) -> Response:
        return await routes.infer_v2(request, name, version)

    @app.post("/v1/models/{name}:predict")
    async def predict(request: Request, name: str) -> Response:
        return await routes.predict_v1(request, name)


def _is_directory(path: str) -> bool:
    return Path(path).is_dir()


def _load_failure(uri: str, exc: Exception) -> InvalidInput:
    """The caller's error for a load that raised; internals (paths, tracebacks) stay in the log."""
    if isinstance(exc, ValueError | ModuleNotFoundError):
        return InvalidInput(f"cannot load {uri!r}: {exc}")
    error_id = uuid.uuid4().hex[:12]
    log.error("model load failed", exc_info=exc, extra={"uri": uri, "error_id": error_id})
    return InvalidInput(f"cannot load {uri!r}: {type(exc).__name__} (error id {error_id})")


def _register_repository(app: FastAPI, routes: _Routes) -> None:
    config = routes.config

    @app.post("/v2/repository/models/{name}/load")
    async def load(request: Request, name: str) -> Response:
        routes.check_name(name)
        raw = await routes.body(request)
        body = decode_body(raw, LoadRequest)
        uri = body.parameters.uri or config.model
        if uri != config.model:
            refusal = uri_refusal(
                uri,
                config.allowed_model_uris,
                is_directory=_is_directory,
                real_path=os.path.realpath,
            )
            if refusal is not None:
                raise Forbidden(refusal)
        try:
            loaded = await routes.rt.load_version(uri, body.parameters.version)
        except FleetserveError:
            raise
        except Exception as exc:  # user code: any failure means "cannot load"
            raise _load_failure(uri, exc) from None
        return json_response({"name": name, "active_version": loaded.version})

    @app.post("/v2/repository/models/{name}/unload")
    async def unload(name: str) -> Response:
        routes.check_name(name)
        released = routes.rt.release_previous()
        return json_response({"name": name, "released_version": released})
