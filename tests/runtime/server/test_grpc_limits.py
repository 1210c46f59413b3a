"""The gRPC listener's connection limits, seen on the wire by a client that speaks raw HTTP/2.

The server runs as its own process with small limits: the HTTP/2 SETTINGS it announces carry
`grpc_max_concurrent_streams`; a connection without an RPC is closed after
`grpc_idle_timeout_s`, one that never finishes its handshake after `http.header_timeout_s`,
one that floods pings at once (GOAWAY `too_many_pings`); an answer over
`grpc_max_send_bytes` is RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.runtime.server.grpc_process import grpc_runtime

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, PING, GOAWAY = 0x4, 0x6, 0x7
ACK = 0x1
MAX_CONCURRENT_STREAMS = 0x3
ENHANCE_YOUR_CALM = 0xB
STREAMS = 7
IDLE_S = 4.0
HEADER_TIMEOUT_S = 0.3
MAX_SEND = 1024


@pytest.fixture(scope="module")
def grpc_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("grpc-limits")
    model = "builtin://synthetic?latency_ms=0&per_item_ms=0&dim=16"
    flags = [
        f"--grpc-max-concurrent-streams={STREAMS}",
        f"--grpc-idle-timeout-s={IDLE_S}",
        f"--grpc-max-send-bytes={MAX_SEND}",
        f"--header-timeout-s={HEADER_TIMEOUT_S}",
    ]
    with grpc_runtime(tmp, model, flags) as (_, grpc_address):
        yield grpc_address


def frame(kind: int, payload: bytes = b"", flags: int = 0) -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, 0) + payload


def read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def read_frame(conn: socket.socket) -> tuple[int, bytes]:
    head = read_exactly(conn, 9)
    length = int.from_bytes(head[:3], "big")
    return head[3], read_exactly(conn, length)


def connect(address: str) -> tuple[socket.socket, dict[int, int]]:
    """An HTTP/2 connection past its handshake, and the SETTINGS the server announced."""
    host, port = address.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(PREFACE + frame(SETTINGS))
    kind, payload = read_frame(conn)
    assert kind == SETTINGS
    conn.sendall(frame(SETTINGS, flags=ACK))
    return conn, dict(struct.iter_unpack(">HI", payload))


def until_goaway(conn: socket.socket) -> tuple[int, bytes]:
    """The error code and debug data of the server's GOAWAY (the socket's timeout bounds it)."""
    while True:
        kind, payload = read_frame(conn)
        if kind == GOAWAY:
            return int.from_bytes(payload[4:8], "big"), payload[8:]


def test_the_announced_stream_limit_is_the_configured_one(grpc_address: str) -> None:
    conn, settings = connect(grpc_address)
    conn.close()
    assert settings[MAX_CONCURRENT_STREAMS] == STREAMS


def test_an_idle_connection_is_closed(grpc_address: str) -> None:
    """No RPC for `grpc_idle_timeout_s`: GOAWAY (NO_ERROR), then the connection closes."""
    started = time.monotonic()
    conn, _ = connect(grpc_address)
    with conn:
        code, debug = until_goaway(conn)
    assert debug == b"connection idle", code
    assert time.monotonic() - started >= IDLE_S * 0.5


def test_a_ping_flood_is_answered_with_goaway(grpc_address: str) -> None:
    """Pings without an RPC, back to back: `too_many_pings` long before the idle timeout."""
    conn, _ = connect(grpc_address)
    with conn:
        conn.settimeout(IDLE_S * 0.9)
        for i in range(10):
            conn.sendall(frame(PING, struct.pack(">Q", i)))
        code, debug = until_goaway(conn)
    assert code == ENHANCE_YOUR_CALM
    assert debug == b"too_many_pings"


def test_a_connection_that_never_shakes_hands_is_closed(grpc_address: str) -> None:
    """Connected, but no HTTP/2 preface: closed after `http.header_timeout_s`.

    That is well before the idle timeout would close it.
    """
    host, port = grpc_address.rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=HEADER_TIMEOUT_S * 5) as conn:
        while conn.recv(1024):  # the server's own SETTINGS, then the close
            pass
    assert time.monotonic() - started < IDLE_S / 2


def test_an_answer_over_the_send_limit_is_resource_exhausted(grpc_address: str) -> None:
    """32 embeddings of 16 floats are 2048 bytes, over `grpc_max_send_bytes` (1024)."""
    client = triton.InferenceServerClient(grpc_address)
    texts = [f"text {i}" for i in range(32)]
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("test", [tensor])
    assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    small = triton.InferInput("text", [2], "BYTES")
    small.set_data_from_numpy(np.array([b"a", b"b"], dtype=np.object_))
    assert client.infer("test", [small]).as_numpy("embedding").shape == (2, 16)
