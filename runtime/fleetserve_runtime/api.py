"""HTTP API: Open Inference Protocol v2 routes, KServe v1 predict, health, repository, metrics.

The only module that knows about HTTP. Routes parse and delegate to `Runtime`; every domain
error becomes a JSON body `{"error": ..., "request_id": ...}` through `STATUS_OF`, the one
error → status table. Bodies are read with a byte limit and parsed strictly (UTF-8, JSON,
schema), so no bad input reaches the model or produces a 500.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import numpy as np
import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleetserve_runtime import __version__
from fleetserve_runtime.config import RuntimeConfig
from fleetserve_runtime.errors import (
    BatchFailed,
    DeadlineExceeded,
    FleetserveError,
    InputTooLong,
    InvalidInput,
    ItemFailed,
    ModelNotFound,
    ModelNotReady,
    OutOfMemory,
    PayloadTooLarge,
    QueueFull,
)
from fleetserve_runtime.models.base import TensorSpec
from fleetserve_runtime.request_queue import Priority
from fleetserve_runtime.runtime import InferenceCall, InferenceResult, Runtime
from fleetserve_runtime.schemas import (
    InferenceRequest,
    LoadRequest,
    RequestParameters,
    V1Request,
    check_instance_count,
    tensor_instances,
)

__all__ = ["STATUS_OF", "create_app"]

log = logging.getLogger("fleetserve.api")

STATUS_OF: dict[type[FleetserveError], int] = {
    InvalidInput: 400,
    ModelNotFound: 404,
    PayloadTooLarge: 413,
    InputTooLong: 413,
    ItemFailed: 500,
    BatchFailed: 500,
    QueueFull: 503,
    ModelNotReady: 503,
    OutOfMemory: 503,
    DeadlineExceeded: 504,
}
"""Error type → HTTP status; the single place where domain errors meet HTTP."""

PRIORITY_HEADER = "x-fleetserve-priority"
TIMEOUT_HEADER = "x-fleetserve-timeout-ms"
Body = TypeVar("Body", bound=BaseModel)


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _error(status: int, message: str, request_id: str, **extra: Any) -> Response:
    headers = {"x-request-id": request_id}
    if "retry_after" in extra:
        headers["retry-after"] = str(extra.pop("retry_after"))
    return _json({"error": message, "request_id": request_id, **extra}, status, headers)


def _error_response(exc: FleetserveError, request_id: str) -> Response:
    status = next(code for kind, code in STATUS_OF.items() if isinstance(exc, kind))
    extra: dict[str, Any] = {}
    if isinstance(exc, QueueFull):
        extra["retry_after"] = max(1, round(exc.retry_after_s))
    if isinstance(exc, BatchFailed):
        extra["error_id"] = exc.error_id
    return _error(status, exc.message, request_id, **extra)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        msg = f"request body of {declared} bytes exceeds the limit of {limit} bytes"
        raise PayloadTooLarge(msg)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            msg = f"request body exceeds the limit of {limit} bytes"
            raise PayloadTooLarge(msg)
        chunks.append(chunk)
    return b"".join(chunks)


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    return f"{where}: {first['msg']}"


async def _parse(request: Request, model: type[Body], limit: int) -> Body:
    raw = await _read_body(request, limit)
    if not raw:
        msg = "request body is empty"
        raise InvalidInput(msg)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"request body is not valid UTF-8 (byte {exc.start})"
        raise InvalidInput(msg) from None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        msg = f"request body is not valid JSON: {exc}"
        raise InvalidInput(msg) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(_describe(exc)) from None


def _call(
    request: Request, instances: list[object], version: str | None, params: RequestParameters | None
) -> InferenceCall:
    params = params or RequestParameters()
    priority_name = request.headers.get(PRIORITY_HEADER) or params.priority or "normal"
    timeout_raw = request.headers.get(TIMEOUT_HEADER)
    timeout_ms = params.timeout_ms
    try:
        priority = Priority.parse(priority_name)
        if timeout_raw is not None:
            timeout_ms = int(timeout_raw)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return InferenceCall(
        instances=instances,
        version=version,
        priority=priority,
        timeout_ms=timeout_ms,
        truncate=params.truncate,
    )


def _timing_headers(result: InferenceResult, total_s: float, request_id: str) -> dict[str, str]:
    t = result.timings
    server_timing = (
        f"queue;dur={t.queue_s * 1000:.3f}, batch;dur={t.batch_s * 1000:.3f}, "
        f"compute;dur={t.compute_s * 1000:.3f}, total;dur={total_s * 1000:.3f}"
    )
    return {
        "x-request-id": request_id,
        "server-timing": server_timing,
        "x-fleetserve-batch-size": str(t.batch_size),
    }


def _stack(results: list[Any]) -> Any:
    if results and all(isinstance(r, np.ndarray) for r in results):
        stacked = np.stack(results)
        return stacked.reshape(-1), list(stacked.shape)
    return results, [len(results)]


def _tensor_meta(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


class _Routes:
    """Route bodies; `app.state.runtime` is set by the lifespan."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.runtime: Runtime | None = None

    @property
    def rt(self) -> Runtime:
        if self.runtime is None:
            msg = "server is starting"
            raise ModelNotReady(msg)
        return self.runtime

    def _check_name(self, name: str) -> None:
        if name != self.config.name:
            msg = f"model {name!r} is not served here (this server serves {self.config.name!r})"
            raise ModelNotFound(msg)

    async def observed(
        self, request: Request, version: str | None, run: Callable[[str], Awaitable[Response]]
    ) -> Response:
        """Run `run(request_id)`, map domain errors, and count the answer in the metrics."""
        started = time.perf_counter()
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        try:
            response = await run(request_id)
        except FleetserveError as exc:
            response = _error_response(exc, request_id)
        except Exception:
            # Nothing should get here; if something does, it is answered (and counted, so a
            # canary's analysis sees it) like any other server error, with an id to find it.
            error_id = uuid.uuid4().hex[:12]
            log.exception("unexpected error", extra={"error_id": error_id})
            response = _error(500, f"internal error (error id {error_id})", request_id)
        if self.runtime is not None:
            self.runtime.metrics.observe_request(
                self._version_label(version), response.status_code, time.perf_counter() - started
            )
        return response

    def _version_label(self, version: str | None) -> str:
        """The metrics label: the loaded version asked for, else the active one.

        Versions that are not loaded share one label, so callers cannot mint series.
        """
        registry = self.rt.registry
        if version is not None:
            return version if version in registry.versions() else "unknown"
        return registry.active.version if registry.is_ready else "none"

    async def infer_v2(self, request: Request, name: str, version: str | None) -> Response:
        async def run(request_id: str) -> Response:
            self._check_name(name)
            body = await _parse(request, InferenceRequest, self.config.max_body_bytes)
            model = self.rt.registry.get(version)
            spec_in, spec_out = model.handler.metadata.inputs[0], model.handler.metadata.outputs[0]
            instances = tensor_instances(
                body.inputs[0],
                expected_name=spec_in.name,
                expected_datatype=spec_in.datatype,
                max_instances=self.config.max_instances,
            )
            started = time.perf_counter()
            result = await self.rt.infer(_call(request, instances, version, body.parameters))
            data, shape = _stack(result.results)
            payload = {
                "model_name": name,
                "model_version": result.model.version,
                "id": body.id or request_id,
                "outputs": [
                    {
                        "name": spec_out.name,
                        "datatype": spec_out.datatype,
                        "shape": shape,
                        "data": data,
                    }
                ],
            }
            headers = _timing_headers(result, time.perf_counter() - started, request_id)
            return _json(payload, headers=headers)

        return await self.observed(request, version, run)

    async def predict_v1(self, request: Request, name: str) -> Response:
        async def run(request_id: str) -> Response:
            self._check_name(name)
            body = await _parse(request, V1Request, self.config.max_body_bytes)
            check_instance_count(len(body.instances), self.config.max_instances)
            started = time.perf_counter()
            result = await self.rt.infer(_call(request, body.instances, None, body.parameters))
            headers = _timing_headers(result, time.perf_counter() - started, request_id)
            return _json({"predictions": result.results}, headers=headers)

        return await self.observed(request, None, run)

    def metadata(self, name: str, version: str | None) -> dict[str, Any]:
        self._check_name(name)
        model = self.rt.registry.get(version)
        meta = model.handler.metadata
        return {
            "name": meta.name,
            "versions": self.rt.registry.versions(),
            "platform": meta.platform,
            "inputs": [_tensor_meta(t) for t in meta.inputs],
            "outputs": [_tensor_meta(t) for t in meta.outputs],
            "parameters": {
                "active_version": self.rt.registry.active.version,
                "max_sequence_length": meta.max_sequence_length,
                **self.rt.describe(model),
            },
        }  # fmt: skip


def create_app(config: RuntimeConfig) -> FastAPI:
    """Build the FastAPI app; the runtime starts in its lifespan and loads the model."""
    routes = _Routes(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(config)
        routes.runtime = runtime
        app.state.runtime = runtime
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(title="fleetserve-runtime", version=__version__, lifespan=lifespan)
    _register_errors(app)
    _register_health(app, routes)
    _register_inference(app, routes)
    _register_repository(app, routes)
    return app


def _register_errors(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        return _error(exc.status_code, str(exc.detail), rid)

    @app.exception_handler(FleetserveError)
    async def domain_error(request: Request, exc: FleetserveError) -> Response:
        return _error_response(exc, request.headers.get("x-request-id") or uuid.uuid4().hex)


def _register_health(app: FastAPI, routes: _Routes) -> None:
    @app.get("/v2")
    async def server_metadata() -> Response:
        return _json(
            {
                "name": "fleetserve-runtime",
                "version": __version__,
                "extensions": ["model_repository"],
            }
        )

    @app.get("/v2/health/live")
    async def live() -> Response:
        return _json({"live": True})

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        runtime = routes.runtime
        if runtime is not None and runtime.is_ready:
            return _json({"ready": True})
        failure = runtime.load_failed if runtime is not None else None
        body: dict[str, Any] = {"ready": False}
        if failure is not None:
            body["error"] = f"model load failed: {failure}"
        return _json(body, 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(routes.rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _register_inference(app: FastAPI, routes: _Routes) -> None:
    @app.get("/v2/models/{name}")
    async def model_metadata(name: str) -> Response:
        return _json(routes.metadata(name, None))

    @app.get("/v2/models/{name}/versions/{version}")
    async def version_metadata(name: str, version: str) -> Response:
        return _json(routes.metadata(name, version))

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> Response:
        routes._check_name(name)  # noqa: SLF001 - module-private helper
        ok = routes.rt.registry.is_ready
        return _json({"name": name, "ready": ok}, 200 if ok else 503)

    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def version_ready(name: str, version: str) -> Response:
        routes._check_name(name)  # noqa: SLF001
        ok = version in routes.rt.registry.versions()
        return _json({"name": name, "version": version, "ready": ok}, 200 if ok else 503)

    @app.post("/v2/models/{name}/infer")
    async def infer(request: Request, name: str) -> Response:
        return await routes.infer_v2(request, name, None)

    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer_version(request: Request, name: str, version: str) -> Response:
        return await routes.infer_v2(request, name, version)

    @app.post("/v1/models/{name}:predict")
    async def predict(request: Request, name: str) -> Response:
        return await routes.predict_v1(request, name)


def _register_repository(app: FastAPI, routes: _Routes) -> None:
    @app.post("/v2/repository/models/{name}/load")
    async def load(request: Request, name: str) -> Response:
        routes._check_name(name)  # noqa: SLF001
        body = await _parse(request, LoadRequest, routes.config.max_body_bytes)
        uri = body.parameters.uri or routes.config.model
        try:
            loaded = await routes.rt.load_version(uri, body.parameters.version)
        except FleetserveError:
            raise
        except Exception as exc:  # noqa: BLE001 - user code: any failure means "cannot load"
            raise InvalidInput(f"cannot load {uri!r}: {exc}") from None
        return _json({"name": name, "active_version": loaded.version})

    @app.post("/v2/repository/models/{name}/unload")
    async def unload(name: str) -> Response:
        routes._check_name(name)  # noqa: SLF001
        released = routes.rt.registry.release_previous()
        return _json({"name": name, "released_version": released})
