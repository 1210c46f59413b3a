"""NVIDIA's `tritonclient.grpc`, with its defaults, against the real server's gRPC listener.

The server runs as its own process (`--grpc-port`) over loopback, with a bearer token: gRPC
answers equal HTTP's, through the same queue and metrics; errors arrive as gRPC codes; a
client deadline is DEADLINE_EXCEEDED. The generated code must be what `make proto` makes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from pydantic import ValidationError
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from fleetserve_runtime.testing import make_config, metric_total
from fleetserve_runtime.testing.process import CLI
from tests.runtime.server.grpc_process import grpc_runtime

ROOT = Path(__file__).resolve().parents[3]
PROTO = "fleetserve_runtime/server/oip/inference.proto"
TOKEN = "grpc-test-token-0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PRIORITY_TOKEN = "grpc-priority-token-0123456789"
PRIORITY_AUTH = {"authorization": f"Bearer {PRIORITY_TOKEN}"}
DEFAULT_TIMEOUT_MS = 5000
METADATA = tuple(AUTH.items())
LYING = b"\xff\x00\x00\x00abc"
"""One BYTES element whose length prefix (255) runs past the 3 bytes that follow it."""
TEXTS = ["the river runs to the sea", "a quiet library", "héllo wörld ✓"]
MAX_BODY = 65536
STALL = "stall"


class Server:
    """Addresses of one running server."""

    def __init__(self, http: str, grpc_address: str) -> None:
        self.http = http
        self.grpc = grpc_address


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("grpc")
    token_file = tmp / "token"
    token_file.write_text(TOKEN)
    priority_token_file = tmp / "priority-token"
    priority_token_file.write_text(PRIORITY_TOKEN)
    model = "builtin://synthetic?latency_ms=0&per_item_ms=0&dim=16&stall_ms=1500"
    flags = [
        f"--auth-token-file={token_file}",
        f"--priority-token-file={priority_token_file}",
        f"--default-timeout-ms={DEFAULT_TIMEOUT_MS}",
        f"--max-body-bytes={MAX_BODY}",
    ]
    with grpc_runtime(tmp, model, flags) as (http, grpc_address):
        yield Server(http, grpc_address)


def text_input(texts: list[str]) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    return tensor


def http_embeddings(server: Server, texts: list[str]) -> np.ndarray:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    response = httpx.post(f"{server.http}/v2/models/test/infer", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def requests_counted(server: Server, code: str) -> float:
    text = httpx.get(f"{server.http}/metrics").text
    return metric_total(text, "fleetserve_requests_total", code=code)


def grpc_error(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_generated_code_is_what_make_proto_makes(tmp_path: Path) -> None:
    """The committed stubs match a fresh `make proto` run, so they cannot drift from the proto."""
    from grpc_tools import protoc

    runtime = ROOT / "runtime"
    out = f"{tmp_path}"
    args = ["protoc", f"-I{runtime}", f"--python_out={out}", f"--pyi_out={out}"]
    assert protoc.main([*args, f"--grpc_python_out={out}", str(runtime / PROTO)]) == 0
    for name in ["inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py"]:
        fresh = (tmp_path / "fleetserve_runtime/server/oip" / name).read_text()
        assert fresh == (runtime / "fleetserve_runtime/server/oip" / name).read_text(), name


@pytest.mark.parametrize("version", ["", "v1"], ids=["active", "versioned"])
def test_infer_with_client_defaults_equals_http(server: Server, version: str) -> None:
    """Raw input contents in, raw output back: the same embeddings as the HTTP JSON path."""
    client = triton.InferenceServerClient(server.grpc)
    before = requests_counted(server, "200")
    result = client.infer("test", [text_input(TEXTS)], model_version=version, headers=AUTH)
    embeddings = result.as_numpy("embedding")
    assert embeddings.dtype == np.float32
    assert embeddings.shape == (len(TEXTS), 16)
    np.testing.assert_array_equal(embeddings, http_embeddings(server, TEXTS))
    assert result.get_response().model_version == "v1"
    # The gRPC call and the HTTP call are both counted, in the same series.
    assert requests_counted(server, "200") == before + 2


def test_typed_contents_equal_raw(server: Server) -> None:
    """`contents.bytes_contents` instead of raw bytes: the same answer."""
    request = service_pb2.ModelInferRequest(model_name="test")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(TEXTS)])
    tensor.contents.bytes_contents.extend(t.encode() for t in TEXTS)
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request, metadata=METADATA, timeout=10)
    raw = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
    np.testing.assert_array_equal(
        raw.reshape(list(response.outputs[0].shape)), http_embeddings(server, TEXTS)
    )


def test_health_and_metadata(server: Server) -> None:
    """Probes, server and model metadata, as over HTTP; liveness needs no token."""
    client = triton.InferenceServerClient(server.grpc)
    assert client.is_server_live()
    assert client.is_server_ready(headers=AUTH)
    assert client.is_model_ready("test", headers=AUTH)
    assert client.is_model_ready("test", "v1", headers=AUTH)
    assert not client.is_model_ready("test", "v9", headers=AUTH)
    meta = client.get_model_metadata("test", headers=AUTH, as_json=True)
    assert meta["versions"] == ["v1"]
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("text", "BYTES")]
    assert client.get_server_metadata(headers=AUTH, as_json=True)["name"] == "fleetserve-runtime"


@pytest.mark.parametrize(
    "headers",
    [pytest.param(None, id="no-token"), pytest.param({"authorization": "Bearer nope"}, id="wrong")],
)
def test_inference_needs_the_token(server: Server, headers: dict[str, str] | None) -> None:
    """UNAUTHENTICATED without the bearer token in metadata, for inference and metadata."""
    client = triton.InferenceServerClient(server.grpc)
    error = grpc_error(lambda: client.infer("test", [text_input(TEXTS)], headers=headers))
    assert error.status() == "StatusCode.UNAUTHENTICATED"
    assert "bearer token" in error.message()
    error = grpc_error(lambda: client.get_model_metadata("test", headers=headers))
    assert error.status() == "StatusCode.UNAUTHENTICATED"


def test_bad_input_is_invalid_argument(server: Server) -> None:
    """Wrong input name, wrong datatype, raw bytes that lie: INVALID_ARGUMENT, by name."""
    client = triton.InferenceServerClient(server.grpc)
    wrong_name = triton.InferInput("words", [1], "BYTES")
    wrong_name.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
    error = grpc_error(lambda: client.infer("test", [wrong_name], headers=AUTH))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'text'" in error.message()
    wrong_type = triton.InferInput("text", [2], "FP32")
    wrong_type.set_data_from_numpy(np.zeros(2, dtype=np.float32))
    error = grpc_error(lambda: client.infer("test", [wrong_type], headers=AUTH))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "BYTES" in error.message()
    lying = service_pb2.ModelInferRequest(model_name="test", raw_input_contents=[LYING])
    lying.inputs.add(name="text", datatype="BYTES", shape=[1])
    with grpc.insecure_channel(server.grpc) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(lying, metadata=METADATA)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "past the end" in caught.value.details()


def raw_infer(
    server: Server,
    headers: dict[str, str],
    parameters: dict[str, str | int],
    timeout_s: float | None = None,
) -> service_pb2.ModelInferResponse:
    """ModelInfer through the generated stub, with these request parameters.

    tritonclient reserves the `priority` parameter for Triton's integer levels, while this
    server takes the level's name, as over HTTP.
    """
    request = service_pb2.ModelInferRequest(model_name="test")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(TEXTS)])
    tensor.contents.bytes_contents.extend(t.encode() for t in TEXTS)
    for key, value in parameters.items():
        if isinstance(value, str):
            request.parameters[key].string_param = value
        else:
            request.parameters[key].int64_param = value
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response: service_pb2.ModelInferResponse = stub.ModelInfer(
            request, metadata=tuple(headers.items()), timeout=timeout_s
        )
    return response


@pytest.mark.parametrize(
    "parameters",
    [{"priority": "high"}, {"timeout_ms": DEFAULT_TIMEOUT_MS + 1}],
    ids=["high-priority", "long-timeout"],
)
def test_raising_priority_or_timeout_needs_the_priority_token(
    server: Server, parameters: dict[str, str | int]
) -> None:
    """PERMISSION_DENIED naming the parameter for the inference token; served for the other."""
    with pytest.raises(grpc.RpcError) as caught:
        raw_infer(server, AUTH, parameters)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"parameters.{next(iter(parameters))}" in caught.value.details()
    assert "priority token" in caught.value.details()
    assert len(raw_infer(server, PRIORITY_AUTH, parameters).raw_output_contents) == 1


def test_lowering_priority_and_a_long_client_deadline_need_no_priority_token(
    server: Server,
) -> None:
    """Asking for less is open to every caller, and a client deadline only ever shortens."""
    assert raw_infer(server, AUTH, {"priority": "low"}).raw_output_contents
    assert raw_infer(server, AUTH, {"timeout_ms": DEFAULT_TIMEOUT_MS - 1}).raw_output_contents
    assert raw_infer(server, AUTH, {}, timeout_s=600).raw_output_contents


def test_a_tenant_named_to_a_runtime_without_tenants_is_invalid_argument(server: Server) -> None:
    """No tenants table: a call naming a tenant in its metadata is refused, never served."""
    with pytest.raises(grpc.RpcError) as caught:
        raw_infer(server, {**AUTH, "x-fleetserve-tenant": "gold"}, {})
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no tenants table" in caught.value.details()


def test_unknown_model_is_not_found(server: Server) -> None:
    client = triton.InferenceServerClient(server.grpc)
    error = grpc_error(lambda: client.infer("other", [text_input(TEXTS)], headers=AUTH))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "'other'" in error.message()


def test_message_over_the_body_limit_is_resource_exhausted(server: Server) -> None:
    """`max_body_bytes` bounds gRPC messages too."""
    client = triton.InferenceServerClient(server.grpc)
    error = grpc_error(lambda: client.infer("test", [text_input(["x" * MAX_BODY])], headers=AUTH))
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"


UNDECODED = """
from fleetserve_runtime.server import grpc_api
from fleetserve_runtime.core.errors import PayloadTooLarge
from fleetserve_runtime.server.oip import inference_pb2 as pb
from fleetserve_runtime.server.schemas import TensorLimits

def refuse_to_decode(*args):
    raise AssertionError("decoded a request that its declared counts already refuse")

grpc_api.decode_tensor = grpc_api._typed_values = refuse_to_decode
limits = TensorLimits(max_rank=8, max_elements=1_048_576, max_instances=256)
n = 1_000_000
raw = pb.ModelInferRequest(model_name="test", raw_input_contents=[bytes(4 * n)])
raw.inputs.add(name="text", datatype="BYTES", shape=[n])
typed = pb.ModelInferRequest(model_name="test")
typed.inputs.add(name="text", datatype="BYTES", shape=[1, n]).contents.bytes_contents.extend(
    [b""] * n
)
for request in (raw, typed):
    try:
        grpc_api._request_input(request, limits)
    except PayloadTooLarge as exc:
        print(exc.message)
"""


def test_bytes_over_the_limits_are_refused_before_decoding() -> None:
    """A million BYTES elements, raw or typed: refused by their declared counts, undecoded.

    In a process of its own: this one holds tritonclient's protobuf names, which the
    runtime's generated code would claim again.
    """
    done = subprocess.run(
        [sys.executable, "-c", UNDECODED], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    refusals = done.stdout.splitlines()
    assert len(refusals) == 2
    assert "declares 1000000 instances" in refusals[0]
    assert "1000000 BYTES elements" in refusals[1]
    assert all("(max_instances)" in refusal for refusal in refusals)


def test_client_deadline_is_deadline_exceeded_and_counted_as_504(server: Server) -> None:
    """A request still computing at the client's deadline: DEADLINE_EXCEEDED, a 504 in metrics."""
    client = triton.InferenceServerClient(server.grpc)
    before = requests_counted(server, "504")
    error = grpc_error(
        lambda: client.infer("test", [text_input([STALL])], headers=AUTH, client_timeout=0.3)
    )
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    # The stalled batch ends after the deadline; its request is counted when the RPC ends.
    until = time.monotonic() + 5
    while requests_counted(server, "504") == before and time.monotonic() < until:
        time.sleep(0.1)
    assert requests_counted(server, "504") == before + 1


def test_grpc_port_must_differ_from_the_http_port() -> None:
    with pytest.raises(ValidationError, match=r"grpc_port \(8080\) must differ from port"):
        make_config(port=8080, grpc_port=8080)


def test_a_taken_grpc_port_stops_start_up_with_a_message() -> None:
    """The port is checked with the HTTP ones, before anything starts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [CLI, "serve", "--model=builtin://synthetic", "--port=0", f"--grpc-port={port}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
