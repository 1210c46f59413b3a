"""Connections that clients of a real server process try to hold open, and their logs.

A client that keeps trickling bytes after its answer, or blank lines between requests,
must not keep a connection; refused requests are logged once, with their request id. The
servers are `conftest.py`'s.
"""

from __future__ import annotations

import json
import select
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetserve_runtime.testing.process import (
    INFER,
    Secured,
    Server,
    assert_clean_error,
    exchange,
    parse_response,
)

HEADER_TIMEOUT_S = 2.0
"""`--header-timeout-s` of the `plain` server."""
CLOSE_MARGIN_S = 1.5
"""Slack past a deadline for the event loop of a loaded 2-core CI machine."""


@dataclass(frozen=True)
class Held:
    """What a client that kept sending saw."""

    data: bytes
    """Everything the server sent."""
    closed_after_s: float | None
    """Seconds from connecting until the server closed the connection; None: still open."""


def hold_open(port: int, first: bytes, trickle: bytes, *, gap_s: float, limit_s: float) -> Held:
    """Send `first`, then `trickle` every `gap_s` whatever the server answers, for `limit_s`.

    Unlike `exchange`, the client does not stop sending when an answer arrives: it is the
    attacker that keeps a connection busy with bytes the server has no use for.
    """
    started = time.monotonic()
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as sock:
        sock.sendall(first)
        while time.monotonic() - started < limit_s:
            if select.select([sock], [], [], gap_s)[0]:
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    return Held(data, time.monotonic() - started)
                data += chunk
                continue
            try:
                sock.sendall(trickle)
            except OSError:
                return Held(data, time.monotonic() - started)
    return Held(data, None)


def _head(method: str, path: str, *headers: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: x", *headers, "", ""]).encode()


@pytest.mark.parametrize(
    ("first", "trickle", "status"),
    [
        pytest.param(
            _head("POST", INFER, "Content-Type: application/json", "Content-Length: 100000000"),
            b"a",
            413,
            id="413-by-content-length",
        ),
        pytest.param(
            _head("POST", INFER, "Content-Type: text/plain", "Content-Length: 1000"),
            b"a",
            415,
            id="415",
        ),
        pytest.param(_head("POST", "/nowhere", "Content-Length: 1000"), b"a", 404, id="404"),
        pytest.param(_head("PUT", INFER, "Content-Length: 1000"), b"a", 405, id="405"),
        pytest.param(
            _head("GET", "/v2/health/live", "Transfer-Encoding: chunked"),
            b"1\r\na\r\n",
            200,
            id="probe",
        ),
    ],
)
def test_a_body_left_unread_cannot_hold_the_connection(
    plain: tuple[Server, Path], first: bytes, trickle: bytes, status: int
) -> None:
    """Answered before its body arrived, a request's connection closes with the answer.

    The client trickles the rest of the body after the answer, one piece every 0.5 s; each
    piece used to restart uvicorn's keep-alive timer, so the connection stayed open for good.
    """
    server, _ = plain
    held = hold_open(
        server.port, first, trickle, gap_s=0.5, limit_s=HEADER_TIMEOUT_S + CLOSE_MARGIN_S
    )
    assert held.closed_after_s is not None, "the trickling client kept the connection"
    code, headers, _ = parse_response(held.data)
    assert code == status
    assert headers["connection"] == "close"


def test_an_unauthenticated_body_cannot_hold_the_connection(secured: Secured) -> None:
    """A 401 answered before the body arrived says `Connection: close`, and closes."""
    head = _head("POST", INFER, "Content-Type: application/json", "Content-Length: 100000000")
    held = hold_open(
        secured.server.port, head, b"a", gap_s=0.5, limit_s=HEADER_TIMEOUT_S + CLOSE_MARGIN_S
    )
    assert held.closed_after_s is not None, "the trickling client kept the connection"
    code, headers, body = parse_response(held.data)
    assert_clean_error(code, body, 401)
    assert headers["connection"] == "close"


def test_blank_lines_after_a_response_cannot_hold_the_connection(
    plain: tuple[Server, Path],
) -> None:
    """After a response, only a request's first byte stops the idle clock; blank lines do not.

    The parser skips blank lines between requests, so no request ever began and no header
    clock ran: a client sending an empty line every 0.5 s held the connection for good.
    """
    server, _ = plain
    held = hold_open(
        server.port,
        _head("GET", "/v2/health/live"),
        b"\r\n",
        gap_s=0.5,
        limit_s=3 * HEADER_TIMEOUT_S,
    )
    code, headers, _ = parse_response(held.data)
    assert (code, headers.get("connection")) == (200, None), "kept alive at first"
    assert held.closed_after_s is not None, "blank lines kept the connection"
    assert held.closed_after_s < HEADER_TIMEOUT_S + CLOSE_MARGIN_S


def test_a_flood_of_blank_lines_counts_against_max_header_bytes(
    plain: tuple[Server, Path],
) -> None:
    """Blank lines between requests are header bytes: past max_header_bytes, 431."""
    server, _ = plain
    held = hold_open(
        server.port,
        _head("GET", "/v2/health/live"),
        b"\r\n" * 2500,
        gap_s=0.5,
        limit_s=HEADER_TIMEOUT_S + CLOSE_MARGIN_S,
    )
    first, _, second = held.data.partition(b"HTTP/1.1 431 ")
    assert first.startswith(b"HTTP/1.1 200 ")
    assert b"max_header_bytes" in second
    assert held.closed_after_s is not None


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET / HTTP/1.1\r\nX-Request-ID: r-7\r\nBad Header\r\n\r\n", id="header"),
        pytest.param(
            f"POST {INFER} HTTP/1.1\r\nX-Request-ID: r-8\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\nzz\r\n".encode(),
            id="chunk",
        ),
    ],
)
def test_refused_requests_are_logged_once_with_their_request_id(
    plain: tuple[Server, Path], request_bytes: bytes
) -> None:
    """The refusal's log record carries the answer's request id; uvicorn's bare copy is gone.

    The id is the caller's when its header was read before the error, else a fresh one.
    """
    server, log = plain
    code, headers, body = parse_response(exchange(server.port, [request_bytes]).data)
    error = assert_clean_error(code, body, 400)
    request_id = headers["x-request-id"]
    assert error["request_id"] == request_id
    deadline = time.monotonic() + 10
    refused: list[dict[str, object]] = []
    while not refused and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = log.read_text().splitlines()
        # Only JSON records: torch's profiler writes a line of its own to stderr.
        records = [json.loads(line) for line in lines if line.startswith("{")]
        refused = [
            r for r in records if r.get("request_id") == request_id and r["msg"] != "request"
        ]
    assert [(r["msg"], r["status"]) for r in refused] == [("request refused", 400)]
    assert not [r for r in records if r["msg"] == "Invalid HTTP request received."]
    if b"r-8" in request_bytes:
        assert request_id == "r-8"
