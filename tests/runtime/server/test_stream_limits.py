"""Streams whose clients stop reading, over real loopback: cut, cancelled, counted, capped.

A raw socket client with a small receive buffer sends a streaming request and never reads;
the server must close it within `generation.stream_send_timeout_s`, or at once when the
client falls `generation.stream_buffer_bytes` behind, cancelling the generation and freeing
its KV blocks. The server runs under uvicorn with the runtime's hardened protocol, which
offers each request its connection (`http_protocol.offer_connection`).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.server.http_protocol import hardened_protocol
from fleetserve_runtime.testing import make_config
from tests.runtime.uvicorn_thread import uvicorn_thread

CHAT = "/v1/chat/completions"
LLM = "builtin://synthetic-generate?per_token_ms={ms}&output_tokens=100000&context_length=8192"
MAX_TOKENS = 6000
"""About 1 MB of chat chunks: more than the socket buffers of both ends and uvicorn's take."""
STREAM_BYTES = 1_300_000
"""About how many bytes that answer takes on the wire (measured: 1.32 MB)."""
LIMIT_S = 30.0
"""Bound of every wait here: none should come near it."""


@contextmanager
def serving(*, per_token_ms: float = 0, **generation: Any) -> Iterator[int]:
    """A generative runtime under uvicorn on a free loopback port; yields the port."""
    config = make_config(
        model=LLM.format(ms=per_token_ms),
        generation={"max_output_tokens": 8000, **generation},
    )
    http = hardened_protocol(header_timeout_s=10.0, max_header_bytes=16_384)
    with uvicorn_thread(create_app(config), loop="uvloop", http=http) as port:
        ready = f"http://127.0.0.1:{port}/v2/health/ready"
        wait_for(lambda: httpx.get(ready, timeout=LIMIT_S).is_success, "the model is not ready")
        yield port


def chat_request(max_tokens: int = MAX_TOKENS) -> bytes:
    body = json.dumps(
        {
            "model": "test",
            "messages": [{"role": "user", "content": "the river runs"}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: rt\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def stalled_client(port: int) -> socket.socket:
    """A connection that sent a streaming request and will not read (4 KiB receive buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(LIMIT_S)
    sock.connect(("127.0.0.1", port))
    sock.sendall(chat_request())
    return sock


def metrics(port: int) -> dict[str, float]:
    """The unlabelled-enough view of `/metrics` these tests need: series → value."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=LIMIT_S).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            values[series] = float(value)
    return values


def metric(port: int, name: str, **labels: str) -> float:
    """The sum of `name`'s series whose labels include `labels`."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    return sum(
        value
        for series, value in metrics(port).items()
        if series.split("{")[0] == name and all(label in series for label in wanted)
    )


def cut(port: int, limit: str) -> float:
    return metric(port, "fleetserve_generation_stream_limits_total", limit=limit)


def wait_for(condition: Any, what: str) -> float:
    """Poll `condition()` until true; seconds it took. Fails after `LIMIT_S`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < LIMIT_S, f"not within {LIMIT_S}s: {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def read_until_closed(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything still readable, and whether the connection ended with a reset."""
    data = b""
    try:
        while chunk := sock.recv(65_536):
            data += chunk
    except ConnectionResetError:
        return data, True
    return data, False


def engine_idle(port: int) -> bool:
    """No sequence runs and every KV block is free again."""
    return (
        metric(port, "fleetserve_running_sequences") == 0
        and metric(port, "fleetserve_kv_cache_usage_ratio") == 0
    )


def test_a_client_that_stops_reading_is_cut_at_the_send_deadline() -> None:
    """Nothing read for `stream_send_timeout_s`: the connection is reset, the cut counted.

    The buffer is made large enough that only the deadline can cut the stream.
    """
    with serving(stream_send_timeout_s=1.0, stream_buffer_bytes=64 * 1024**2) as port:
        sock = stalled_client(port)
        with sock:
            took = wait_for(lambda: cut(port, "send_timeout") == 1, "the stream was not cut")
            assert took < 10
            data, reset = read_until_closed(sock)
        assert reset, "the connection was closed gracefully, keeping its unsent bytes"
        assert data.startswith(b"HTTP/1.1 200")
        assert b"data: [DONE]" not in data
        wait_for(lambda: engine_idle(port), "the engine kept the sequence")
        assert metric(port, "fleetserve_requests_total", code="499") == 1


def test_a_client_a_buffer_behind_has_its_generation_cancelled() -> None:
    """Past `stream_buffer_bytes` the sequence is cancelled mid-generation, its blocks freed."""
    settings = {"stream_send_timeout_s": 60.0, "stream_buffer_bytes": 16_384}
    with serving(per_token_ms=1, **settings) as port:
        sock = stalled_client(port)
        with sock:
            wait_for(lambda: cut(port, "buffer") == 1, "the stream was not cut")
            data, reset = read_until_closed(sock)
            assert reset, "the connection was closed gracefully, keeping its unsent bytes"
        wait_for(lambda: engine_idle(port), "the sequence kept running or kept its blocks")
        generated = metric(port, "fleetserve_generation_tokens_total")
        assert generated < MAX_TOKENS / 2, "the generation ran on after the cut"
        assert cut(port, "send_timeout") == 0
        assert b"data: [DONE]" not in data


def test_a_slow_reader_within_the_deadline_gets_its_whole_answer() -> None:
    """A client reading steadily, slower than the model, is never cut.

    The reader is paced to take half as long again as the send deadline over the whole
    answer, so a deadline counted from the stream's start would cut it; each write waits
    only a fraction of the deadline, which leaves seconds of slack for a loaded machine.
    """
    deadline_s = 4.0
    pace_bytes_per_s = STREAM_BYTES / (1.5 * deadline_s)
    with serving(stream_send_timeout_s=deadline_s, stream_buffer_bytes=4 * 1024**2) as port:
        sock = stalled_client(port)
        data = b""
        with sock:
            started = time.monotonic()
            while not data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
                elapsed = time.monotonic() - started
                assert elapsed < LIMIT_S, "the answer did not end"
                time.sleep(max(0.0, len(data) / pace_bytes_per_s - elapsed))
                chunk = sock.recv(8192)
                assert chunk, "the server closed the stream early"
                data += chunk
            took = time.monotonic() - started
        assert took > deadline_s, "the answer was read faster than the deadline"
        assert data.startswith(b"HTTP/1.1 200")
        assert b'"finish_reason":"length"' in data
        assert data.count(b'"content":') == MAX_TOKENS + 1  # the role chunk says "" too
        assert cut(port, "send_timeout") == cut(port, "buffer") == 0
        assert metric(port, "fleetserve_requests_total", code="200") == 1


def test_streams_beyond_max_streams_get_503_with_retry_after() -> None:
    """At `max_streams` a new stream is refused (OpenAI's error shape), counted; it frees."""
    with serving(per_token_ms=5, max_streams=2) as port:
        url = f"http://127.0.0.1:{port}{CHAT}"
        body = {"model": "test", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        held = [stalled_client(port) for _ in range(2)]
        try:
            for sock in held:
                assert sock.recv(12) == b"HTTP/1.1 200"
            refused = httpx.post(url, json=body, timeout=LIMIT_S)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "too_many_streams"
            assert "generation.max_streams" in error["message"]
            unstreamed = httpx.post(url, json={**body, "stream": False}, timeout=LIMIT_S)
            assert unstreamed.status_code == 200, "only streams count against the cap"
        finally:
            for sock in held:
                sock.close()
        assert cut(port, "max_streams") == 1
        wait_for(
            lambda: httpx.post(url, json={**body, "max_tokens": 4}, timeout=LIMIT_S).is_success,
            "the streams of closed connections kept their slots",
        )


def test_a_pipelined_second_stream_waits_for_the_first() -> None:
    """Two streams pipelined on one connection are both answered, with `max_streams` 1.

    HTTP/1.1 serves a connection's requests in turn: the second starts after the first.
    """
    with serving(max_streams=1) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=LIMIT_S) as sock:
            sock.sendall(chat_request(8) + chat_request(8))
            data = b""
            started = time.monotonic()
            while data.count(b"\r\n0\r\n\r\n") < 2:
                assert time.monotonic() - started < LIMIT_S, "the answers did not end"
                chunk = sock.recv(65_536)
                assert chunk, "the server closed the connection"
                data += chunk
        first, second = data.split(b"\r\n0\r\n\r\n")[:2]
        assert first.startswith(b"HTTP/1.1 200")
        assert second.startswith(b"HTTP/1.1 200")
        assert first.count(b"data: [DONE]") == second.count(b"data: [DONE]") == 1
        assert cut(port, "max_streams") == 0
