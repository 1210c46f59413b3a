"""Tenants on the gRPC listener: the same table, quota and priority rules as over HTTP.

The server runs as its own process (`--grpc-port`) over loopback, with an inference token and
a tenants table; the synthetic encoder stalls 1.5 s on the text "stall", which holds a
request in flight while others are sent. Calls go through the generated stub (tritonclient
reserves the `priority` parameter for Triton's integer levels).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.runtime.server.grpc_process import grpc_runtime

TOKEN = "grpc-test-token-0123456789"
NOISY = {"authorization": "Bearer noisy-grpc-secret-0123456789"}
QUIET = {"authorization": "Bearer quiet-grpc-secret-0123456789"}
TABLE = {
    "tenants": [
        {"name": "noisy", "tokens": [NOISY["authorization"][7:]], "max_requests": 1},
        {"name": "quiet", "tokens": [QUIET["authorization"][7:]]},
    ]
}
STALL = "stall"


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("grpc-tenants")
    (tmp / "token").write_text(TOKEN)
    (tmp / "tenants.json").write_text(json.dumps(TABLE))
    model = "builtin://synthetic?latency_ms=0&per_item_ms=0&dim=16&stall_ms=1500"
    flags = [f"--auth-token-file={tmp / 'token'}", f"--tenants-file={tmp / 'tenants.json'}"]
    with grpc_runtime(tmp, model, flags) as (_, grpc_address):
        yield grpc_address


def infer(
    address: str, headers: dict[str, str], *, text: str = "hi", priority: str | None = None
) -> service_pb2.ModelInferResponse:
    request = service_pb2.ModelInferRequest(model_name="test")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(text.encode())
    if priority is not None:
        request.parameters["priority"].string_param = priority
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response: service_pb2.ModelInferResponse = stub.ModelInfer(
            request, metadata=tuple(headers.items()), timeout=30
        )
    return response


def refusal(address: str, headers: dict[str, str], **options: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        infer(address, headers, **options)
    return caught.value


def test_a_tenant_token_authenticates_over_grpc(address: str) -> None:
    assert list(infer(address, QUIET).outputs[0].shape) == [1, 16]


def test_a_tenant_over_its_quota_is_resource_exhausted_and_another_is_served(
    address: str,
) -> None:
    held = threading.Thread(target=lambda: infer(address, NOISY, text=STALL))
    held.start()
    try:
        time.sleep(0.5)  # the stalled call now holds the noisy tenant's one place (1.5 s)
        refused = refusal(address, NOISY)
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_requests" in refused.details()
        assert list(infer(address, QUIET).outputs[0].shape) == [1, 16]
    finally:
        held.join(30)
    assert list(infer(address, NOISY).outputs[0].shape) == [1, 16]


def test_the_tenant_header_and_disallowed_priorities_are_refused(address: str) -> None:
    untrusted = refusal(address, {**QUIET, "x-fleetserve-tenant": "noisy"})
    assert untrusted.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-fleetserve-tenant" in untrusted.details()
    high = refusal(address, QUIET, priority="high")
    assert high.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "quiet" in high.details()
