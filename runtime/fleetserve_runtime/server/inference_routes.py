"""The inference routes: Open Inference Protocol v2, KServe v1 predict, health and metrics.

`Routes` holds the route bodies and what every route shares: the config, the tensor limits,
the runtime (set by the lifespan, used only as a `serving.facade.ServingFacade`), the
priority token, and the request metrics. It is also the host the generation routes, the
model-control routes and the gRPC service are given (`generation.RouteHost`,
`grpc_api.GrpcHost`). Bodies are decoded in time linear in their size (`schemas` checks
declared shapes before touching data), so no bad input reaches the model, produces a 500 or
stalls the event loop for longer than parsing `max_body_bytes` takes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fleetserve_runtime.core.auth import TokenFile, bearer_token, is_privileged
from fleetserve_runtime.core.config import RuntimeConfig
from fleetserve_runtime.core.config_sections import GenerationConfig
from fleetserve_runtime.core.errors import FleetserveError, ModelNotFound, ModelNotReady
from fleetserve_runtime.core.liveness import Liveness
from fleetserve_runtime.core.tenants import CURRENT_TENANT
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
from fleetserve_runtime.server.http_errors import json_response, request_id
from fleetserve_runtime.server.request_body import BINARY_TENSOR_HEADER, read_body, require_json
from fleetserve_runtime.server.responses import failure_response, unexpected_response
from fleetserve_runtime.server.schemas import (
    InferenceRequest,
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

__all__ = ["Routes", "register_health", "register_inference"]


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


class Routes:
    """Route bodies; `runtime` is set by the lifespan and used only as a `ServingFacade`."""

    def __init__(self, config: RuntimeConfig, *, priority_token: TokenFile | None) -> None:
        self.config = config
        self.limits = TensorLimits(
            max_rank=config.max_tensor_rank,
            max_elements=config.max_tensor_elements,
            max_instances=config.max_instances,
        )
        self.runtime: ServingFacade | None = None
        self.priority_token = priority_token

    @property
    def rt(self) -> ServingFacade:
        """The runtime; `ModelNotReady` while the server starts."""
        if self.runtime is None:
            msg = "server is starting"
            raise ModelNotReady(msg)
        return self.runtime

    def check_name(self, name: str) -> None:
        """`ModelNotFound` unless `name` is the served model's name."""
        if name != self.config.name:
            msg = f"model {name!r} is not served here (this server serves {self.config.name!r})"
            raise ModelNotFound(msg)

    async def body(self, request: Request, *, missing_is_json: bool = False) -> bytes:
        """The request's JSON body, unparsed: media type, size and deadline checked.

        `missing_is_json` takes a body without `Content-Type` as JSON (`json_media_refusal`):
        the OIP and KServe inference routes do, as Triton does; generation and model control
        keep requiring `application/json`.
        """
        require_json(request, missing_is_json=missing_is_json)
        return await read_body(request, self.config.max_body_bytes, self.config.http.body_timeout_s)

    async def infer_body(self, request: Request) -> bytes:
        """The v2 infer body, unparsed: JSON, or in the binary tensor data extension.

        A binary body needs no JSON media type: its `Inference-Header-Content-Length`
        header already makes a browser ask for a CORS preflight, as `application/json` does.
        """
        if BINARY_TENSOR_HEADER not in request.headers:
            return await self.body(request, missing_is_json=True)
        return await read_body(request, self.config.max_body_bytes, self.config.http.body_timeout_s)

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
            response = failure_response(exc)
        except Exception:
            # Nothing should get here; if something does, it is answered (and counted, so a
            # canary's analysis sees it) like any other server error, with an id to find it.
            response = unexpected_response()
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
        presented = bearer_token(headers.get("authorization"))
        return scheduling(
            priority_header=headers.get(PRIORITY_HEADER),
            timeout_header=headers.get(TIMEOUT_HEADER),
            priority=priority,
            timeout_ms=timeout_ms,
            default_timeout_ms=default_timeout_ms or self.config.queue.default_timeout_ms,
            privileged=is_privileged(presented, self.priority_token),
            tenant=CURRENT_TENANT.get(),
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
        """`POST /v2/models/{name}[/versions/{version}]/infer`: JSON or binary tensors."""

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
        """`POST /v1/models/{name}:predict` (KServe v1): `instances` in, `predictions` out."""

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
        """The model's (or version's) metadata: versions, tensors, serving parameters."""
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
        """Whether the runtime still makes progress."""
        # A runtime still starting is alive: restarting it would only start it again.
        return self.runtime.liveness() if self.runtime is not None else Liveness(ok=True)


def register_health(app: FastAPI, routes: Routes, *, server_version: str) -> None:
    """Mount server metadata (`server_version` is the package's), the probes, `/metrics`."""
    extensions = ["model_repository"] if routes.config.model_control == "explicit" else []

    @app.get("/v2")
    async def server_metadata() -> Response:
        body = {"name": "fleetserve-runtime", "version": server_version, "extensions": extensions}
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


def register_inference(app: FastAPI, routes: Routes) -> None:
    """Mount model metadata and readiness, v2 inference and KServe v1 predict."""

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
