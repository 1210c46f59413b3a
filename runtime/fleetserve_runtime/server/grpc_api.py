"""The Open Inference Protocol over gRPC: `inference.GRPCInferenceService` on `grpc_port`.

KServe's and Triton's clients speak it by default. `serve_grpc` starts a `grpc.aio` server
on the event loop uvicorn runs, so an RPC goes through the same `ServingFacade` as an HTTP
request: the same queue, batcher, deadlines and request metrics (counted under the HTTP
status the answer stands for, so dashboards and canary analysis see both protocols as one).
The bearer token is the HTTP one, sent as metadata `authorization: Bearer <token>`; the
liveness and readiness RPCs follow the exemptions of their HTTP probe paths. The `priority`
and `timeout_ms` parameters take the HTTP routes' one decision (`serving.admission`): above
the defaults only with the priority token, and a client deadline only ever shortens.

Domain errors become gRPC status codes through `status_of` (the HTTP table) and
`GRPC_CODE_OF_STATUS`, with the same message and an `x-request-id` trailer. A client
deadline becomes the request's timeout; a request over `max_body_bytes` is refused by gRPC
itself (RESOURCE_EXHAUSTED); `server_options` lists every limit of the listener, and
`tls_cert_file` makes it serve TLS. Tensors arrive raw (`raw_input_contents`, decoded as the binary
HTTP extension is) or typed (`contents`); outputs go back raw, as Triton answers.

The generated module registers the protocol's `inference.*` names in protobuf's default
pool, as `tritonclient.grpc` does, so one process cannot import both: `app` imports this
module only when `grpc_port` is set.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

import grpc

from fleetserve_runtime.core.auth import TokenFile, bearer_token, is_privileged, token_matches
from fleetserve_runtime.core.config import RuntimeConfig
from fleetserve_runtime.core.errors import (
    DeadlineExceeded,
    FleetserveError,
    InvalidInput,
    Unauthorized,
)
from fleetserve_runtime.core.liveness import Liveness
from fleetserve_runtime.core.logs import (
    RequestContext,
    bind_request,
    request_id_from,
    unbind_request,
)
from fleetserve_runtime.core.tenants import CURRENT_TENANT, TENANT_HEADER
from fleetserve_runtime.encoder.engine import InferenceCall
from fleetserve_runtime.models.base import TensorSpec
from fleetserve_runtime.server.binary_tensors import (
    DTYPES,
    declared_elements,
    decode_tensor,
    encode_tensor,
    stack_results,
)
from fleetserve_runtime.server.http_errors import log_unexpected, status_of
from fleetserve_runtime.server.model_host import ModelHost
from fleetserve_runtime.server.oip import inference_pb2 as pb
from fleetserve_runtime.server.oip import inference_pb2_grpc
from fleetserve_runtime.server.schemas import (
    RequestInput,
    TensorLimits,
    tensor_instances,
    validate_body,
)
from fleetserve_runtime.server.sse import CLIENT_CLOSED
from fleetserve_runtime.serving.admission import Scheduling, Tenancy, scheduling, served_as_tenant
from fleetserve_runtime.serving.facade import ServingFacade

__all__ = ["GRPC_CODE_OF_STATUS", "MAX_PING_STRIKES", "GrpcHost", "serve_grpc", "server_options"]

_DEADLINE_SLACK_S = 0.05
"""A cancelled RPC this close to its deadline was cancelled by it: the client cancels at its
own deadline, and that can reach the server a few milliseconds before the server's timer."""

log = logging.getLogger("fleetserve.grpc")

_T = TypeVar("_T")

GRPC_CODE_OF_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""HTTP status of a domain error → the gRPC code that means the same to a client."""

_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The typed `contents` field each datatype's values come in; FP16 has none (raw only)."""

STOP_GRACE_S = 10.0
"""How long RPCs in flight may finish at shutdown; uvicorn gives HTTP requests as long."""


class GrpcHost(ModelHost, Protocol):
    """What the gRPC service takes from `inference_routes.Routes` besides a `ModelHost`."""

    @property
    def limits(self) -> TensorLimits:
        """What one request may declare."""
        ...

    def liveness(self) -> Liveness:
        """Whether the runtime still makes progress."""
        ...


_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_Rpc = Callable[["_Service", _Request, Any], Awaitable[_Response]]


def _rpc(
    probe_path: str | None = None,
) -> Callable[[_Rpc[_Request, _Response]], _Rpc[_Request, _Response]]:
    """What every RPC does first: bind its request id (`_bound`), then check its token.

    `probe_path` is the HTTP probe the RPC stands for, exempt from the token as that path is.
    """

    def frame(method: _Rpc[_Request, _Response]) -> _Rpc[_Request, _Response]:
        @functools.wraps(method)
        async def rpc(service: _Service, request: _Request, context: Any) -> _Response:
            with _bound(context):
                await service._authorize(context, probe_path)
                return await method(service, request, context)

        return rpc

    return frame


@dataclass(frozen=True, slots=True)
class _Service:
    """The RPCs; method names are the protocol's. The tokens and tenancy are `serve_grpc`'s."""

    host: GrpcHost
    config: RuntimeConfig
    server_version: str
    token: TokenFile | None
    priority_token: TokenFile | None
    tenancy: Tenancy | None

    @_rpc("/v2/health/live")
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Any
    ) -> pb.ServerLiveResponse:
        """Liveness, as `GET /v2/health/live`."""
        return pb.ServerLiveResponse(live=self.host.liveness().ok)

    @_rpc("/v2/health/ready")
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Any
    ) -> pb.ServerReadyResponse:
        """Readiness, as `GET /v2/health/ready`."""
        try:
            return pb.ServerReadyResponse(ready=self.host.rt.is_ready)
        except FleetserveError:
            return pb.ServerReadyResponse(ready=False)

    @_rpc()
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        """Whether the model (and version) takes requests, as `GET /v2/models/{m}/ready`."""
        rt = await _or_abort(context, lambda: self._served(request.name))
        if request.version:
            return pb.ModelReadyResponse(ready=request.version in rt.versions())
        return pb.ModelReadyResponse(ready=rt.active_version is not None)

    @_rpc()
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        """The server's name and version, as `GET /v2`."""
        extensions = ["model_repository"] if self.config.model_control == "explicit" else []
        return pb.ServerMetadataResponse(
            name="fleetserve-runtime", version=self.server_version, extensions=extensions
        )

    @_rpc()
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        """The model's versions and tensors, as `GET /v2/models/{m}`."""
        rt = await _or_abort(context, lambda: self._served(request.name))
        meta = await _or_abort(context, lambda: rt.model(request.version or None).metadata)
        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=rt.versions(),
            platform=meta.platform,
            inputs=_tensor_metadata(meta.inputs),
            outputs=_tensor_metadata(meta.outputs),
        )

    @_rpc()
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        """One inference through the runtime's queue, as `POST /v2/models/{m}/infer`."""
        version = request.model_version or None
        started = time.perf_counter()
        try:
            remaining_s = context.time_remaining()
            with self._tenant(context):
                answer = self._infer(request, version, remaining_s, self._privileged(context))
                response = await _in_time(answer, remaining_s)
        except FleetserveError as exc:
            self.host.count(version, status_of(exc), time.perf_counter() - started)
            await _abort(context, exc)
        except asyncio.CancelledError:
            # gRPC cancels the handler when the client's deadline passes, often before
            # `_in_time` gives up, or when the client hangs up: counted all the same.
            remaining_s = context.time_remaining()
            passed = remaining_s is not None and remaining_s <= _DEADLINE_SLACK_S
            code = status_of(DeadlineExceeded("cancelled")) if passed else CLIENT_CLOSED
            self.host.count(version, code, time.perf_counter() - started)
            raise
        except Exception:
            # A bug: counted and answered like any server error, the traceback in the log.
            self.host.count(version, 500, time.perf_counter() - started)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"internal error (error id {log_unexpected()})"
            )
        self.host.count(version, 200, time.perf_counter() - started)
        return response

    async def _infer(
        self,
        request: pb.ModelInferRequest,
        version: str | None,
        remaining_s: float | None,
        privileged: bool,
    ) -> pb.ModelInferResponse:
        self.host.check_name(request.model_name)
        default_timeout_ms = self.config.queue.default_timeout_ms
        granted = scheduling(
            priority_header=None,
            timeout_header=None,
            priority=_parameter(request, "priority", "string_param"),
            timeout_ms=_parameter(request, "timeout_ms", "int64_param"),
            default_timeout_ms=default_timeout_ms,
            privileged=privileged,
            tenant=CURRENT_TENANT.get(),
        )
        rt = self.host.rt
        meta = rt.model(version).handler.metadata
        spec_in, spec_out = meta.inputs[0], meta.outputs[0]
        tensor = _request_input(request, self.host.limits)
        instances = tensor_instances(
            tensor,
            expected_name=spec_in.name,
            expected_datatype=spec_in.datatype,
            limits=self.host.limits,
        )
        call = _call(request, instances, version, remaining_s, granted, default_timeout_ms)
        result = await rt.infer(call)
        data, shape = stack_results(result.results)
        output = pb.ModelInferResponse.InferOutputTensor(
            name=spec_out.name, datatype=spec_out.datatype, shape=shape
        )
        return pb.ModelInferResponse(
            model_name=request.model_name,
            model_version=result.model.version,
            id=request.id,
            outputs=[output],
            raw_output_contents=[encode_tensor(data, spec_out.datatype)],
        )

    def _served(self, name: str) -> ServingFacade:
        """The runtime, once `name` is the served model's name."""
        self.host.check_name(name)
        return self.host.rt

    def _privileged(self, context: Any) -> bool:
        """Whether the metadata carries the priority token (`priority_token_file`)."""
        presented = bearer_token(_metadata(context).get("authorization"))
        return is_privileged(presented, self.priority_token)

    @contextmanager
    def _tenant(self, context: Any) -> Iterator[None]:
        """Serve the call as its tenant's (`server.tenancy`): 400 / 429 refusals raise."""
        metadata = _metadata(context)
        with served_as_tenant(
            self.tenancy, metadata.get("authorization"), metadata.get(TENANT_HEADER)
        ):
            yield

    async def _authorize(self, context: Any, probe_path: str | None) -> None:
        """Abort UNAUTHENTICATED unless the metadata carries a token (or this is exempt).

        The priority token authenticates too, as it does over HTTP.
        """
        if self.token is None:
            return
        if probe_path is not None and probe_path in self.config.auth_exempt_paths:
            return
        presented = bearer_token(_metadata(context).get("authorization"))
        if (
            token_matches(presented, self.token.current())
            or is_privileged(presented, self.priority_token)
            or (self.tenancy is not None and self.tenancy.knows(presented))
        ):
            return
        why = "a bearer token is required" if presented is None else "the bearer token is not valid"
        await _abort(context, Unauthorized(why, challenge='Bearer realm="fleetserve"'))


def _metadata(context: Any) -> dict[str, str]:
    return {
        key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)
    }


@contextmanager
def _bound(context: Any) -> Iterator[None]:
    """Bind the RPC's request id to its log records and return it as an `x-request-id` trailer."""
    request_id = request_id_from(_metadata(context).get("x-request-id"))
    context.set_trailing_metadata((("x-request-id", request_id),))
    token = bind_request(RequestContext(request_id=request_id))
    try:
        yield
    finally:
        unbind_request(token)


async def _abort(context: Any, exc: FleetserveError) -> NoReturn:
    """End the RPC with the gRPC code of `exc`'s HTTP status."""
    await context.abort(GRPC_CODE_OF_STATUS[status_of(exc)], exc.message)
    # grpc's `abort` always raises; this tells the type checker, which sees it untyped.
    raise AssertionError(exc.message)


async def _in_time(answer: Awaitable[_T], remaining_s: float | None) -> _T:
    """`answer`, given up at the client's deadline: a batch computing then is not awaited."""
    try:
        async with asyncio.timeout(remaining_s):
            return await answer
    except TimeoutError:
        msg = "the client's deadline passed before the answer was ready"
        raise DeadlineExceeded(msg) from None


async def _or_abort(context: Any, read: Callable[[], _T]) -> _T:
    """`read()`; a domain error it raises ends the RPC with that error's gRPC code."""
    try:
        return read()
    except FleetserveError as exc:
        await _abort(context, exc)


def _tensor_metadata(
    specs: Sequence[TensorSpec],
) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return [tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in specs]


def _request_input(request: pb.ModelInferRequest, limits: TensorLimits) -> RequestInput:
    """The request's one input tensor, its values decoded from raw or typed contents."""
    if len(request.inputs) != 1:
        msg = f"a request has exactly one input, got {len(request.inputs)}"
        raise InvalidInput(msg, param="inputs")
    tensor = request.inputs[0]
    if request.raw_input_contents and len(request.raw_input_contents) != 1:
        msg = f"raw_input_contents has {len(request.raw_input_contents)} entries for 1 input"
        raise InvalidInput(msg, param="raw_input_contents")
    if tensor.datatype not in _CONTENTS_FIELD and tensor.datatype not in DTYPES:
        msg = f"input {tensor.name!r} has an unknown datatype {tensor.datatype!r}"
        raise InvalidInput(msg, param="inputs.0.datatype")
    # Counts first: a message over a limit is refused before any value is decoded.
    elements = declared_elements(tensor.name, list(tensor.shape), tensor.datatype, limits)
    if request.raw_input_contents:
        raw = memoryview(request.raw_input_contents[0])
        values = decode_tensor(tensor.name, tensor.datatype, elements, raw)
    else:
        values = _typed_values(tensor, elements)
    fields = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
    return validate_body({**fields, "data": values}, RequestInput)


def _typed_values(tensor: pb.ModelInferRequest.InferInputTensor, elements: int) -> list[Any]:
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        msg = f"input {tensor.name!r}: {tensor.datatype} values must come in raw_input_contents"
        raise InvalidInput(msg)
    values = getattr(tensor.contents, field)
    if len(values) != elements:
        shape = list(tensor.shape)
        msg = f"input {tensor.name!r}: shape {shape} needs {elements} values, got {len(values)}"
        raise InvalidInput(msg)
    if tensor.datatype != "BYTES":
        return list(values)
    try:
        return [value.decode() for value in values]
    except UnicodeDecodeError:
        msg = f"input {tensor.name!r}: BYTES elements must be UTF-8 text"
        raise InvalidInput(msg) from None


def _parameter(request: pb.ModelInferRequest, key: str, kind: str) -> Any:
    """Request parameter `key`, which must hold a `kind` (`string_param`...); None if absent."""
    if key not in request.parameters:
        return None
    parameter = request.parameters[key]
    if parameter.WhichOneof("parameter_choice") != kind:
        msg = f"parameter {key!r} must be a {kind}"
        raise InvalidInput(msg, param=f"parameters.{key}")
    return getattr(parameter, kind)


def _call(
    request: pb.ModelInferRequest,
    instances: list[object],
    version: str | None,
    remaining_s: float | None,
    granted: Scheduling,
    default_timeout_ms: int,
) -> InferenceCall:
    """The runtime call: the `granted` priority and timeout, cut to the client's deadline.

    A client deadline only ever shortens the timeout (the granted one, else the default): a
    long one is no request for more time, which only the priority token grants.
    """
    timeout_ms = granted.timeout_ms
    if timeout_ms is not None and timeout_ms < 1:
        msg = f"parameter 'timeout_ms' must be at least 1, got {timeout_ms}"
        raise InvalidInput(msg, param="parameters.timeout_ms")
    if remaining_s is not None:
        if remaining_s <= 0:
            msg = "the client's deadline passed before the request was queued"
            raise DeadlineExceeded(msg)
        deadline_ms = math.ceil(remaining_s * 1000)
        timeout_ms = min(timeout_ms or default_timeout_ms, deadline_ms)
    return InferenceCall(
        instances=instances,
        version=version,
        priority=granted.priority,
        timeout_ms=timeout_ms,
        truncate=bool(_parameter(request, "truncate", "bool_param")),
    )


MAX_PING_STRIKES = 2
"""Pings sooner than `grpc_min_ping_interval_s` a connection may send before it is closed."""


def server_options(config: RuntimeConfig) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments: every limit stated, none left to gRPC's defaults.

    - messages: at most `max_body_bytes` in (larger ones: RESOURCE_EXHAUSTED before any
      handler runs) and `grpc_max_send_bytes` out;
    - connections: `grpc_max_concurrent_streams` RPCs at once on one, closed after
      `grpc_idle_timeout_s` without an RPC, and the HTTP/2 handshake due within
      `http.header_timeout_s` of connecting, as HTTP headers are;
    - metadata: at most `http.max_header_bytes`, as HTTP headers;
    - pings: a client may ping at most every `grpc_min_ping_interval_s` while no data flows,
      and not at all while no RPC is in flight; `MAX_PING_STRIKES` pings more close the
      connection, so a ping flood costs a GOAWAY, not a CPU.
    """
    return [
        ("grpc.max_receive_message_length", config.max_body_bytes),
        ("grpc.max_send_message_length", config.grpc_max_send_bytes),
        ("grpc.max_concurrent_streams", config.grpc_max_concurrent_streams),
        ("grpc.max_connection_idle_ms", _ms(config.grpc_idle_timeout_s)),
        ("grpc.server_handshake_timeout_ms", _ms(config.http.header_timeout_s)),
        ("grpc.max_metadata_size", config.http.max_header_bytes),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(config.grpc_min_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.so_reuseport", 0),
    ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _credentials(config: RuntimeConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from `tls_cert_file` and `tls_key_file`, or None to serve plain.

    Read once: a rotated certificate is served after a restart, as over HTTP.
    """
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    key, chain = config.tls_key_file.read_bytes(), config.tls_cert_file.read_bytes()
    return grpc.ssl_server_credentials([(key, chain)])


async def serve_grpc(
    host: GrpcHost,
    config: RuntimeConfig,
    *,
    server_version: str,
    auth_token: TokenFile | None,
    priority_token: TokenFile | None,
    tenancy: Tenancy | None = None,
) -> Callable[[], Awaitable[None]]:
    """Start the gRPC listener on `config.host:config.grpc_port`; returns its stop function.

    `server_version` is what ServerMetadata reports (the package's, which `app` knows).
    `auth_token` and `priority_token` are the HTTP listener's own `TokenFile`s (`app`), so
    both protocols read each token file through one cache; `tenancy`, likewise shared,
    identifies each inference call's tenant and holds its quota (429 is RESOURCE_EXHAUSTED).
    With `tls_cert_file` set it serves TLS only, like the HTTP listener.

    Raises `OSError` when the port cannot be bound. Port reuse is off: two servers on one
    port would split its calls silently.
    """
    server = grpc.aio.server(options=server_options(config))
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        _Service(host, config, server_version, auth_token, priority_token, tenancy),
        server,
    )
    host_part = f"[{config.host}]" if ":" in config.host else config.host
    address = f"{host_part}:{config.grpc_port}"
    credentials = _credentials(config)
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:
        port = 0
    if not port:
        msg = f"cannot listen on {config.host}:{config.grpc_port} (grpc_port)"
        raise OSError(msg)
    await server.start()
    log.info(
        "listening",
        extra={"listener": "grpc", "address": f"{config.host}:{port}", "tls": bool(credentials)},
    )

    async def stop() -> None:
        await server.stop(STOP_GRACE_S)

    return stop
