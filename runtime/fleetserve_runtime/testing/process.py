"""A runtime as a real process: the command line on a free loopback port, and raw HTTP to it.

`running_server` starts `fleetserve-runtime serve` (the console script beside this Python)
and waits for readiness; `plain_server` and `secured_server` are the two configurations the
HTTP hardening tests attack. `exchange` speaks raw HTTP/1.1 over one socket, for what no
HTTP client sends. `free_ports` is the loopback-port picker of the tests and the benches
(the e2e harness, which imports none of the product's packages, has its own). Needs the
test dependency `httpx` (requirements/dev.txt).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = [
    "ADMIN_TOKEN",
    "CLI",
    "INFER",
    "INFERENCE_TOKEN",
    "SYNTH",
    "Exchange",
    "Secured",
    "Server",
    "assert_clean_error",
    "bearer",
    "exchange",
    "free_port",
    "free_ports",
    "parse_response",
    "plain_server",
    "running_server",
    "secured_server",
]

CLI = Path(sys.executable).with_name("fleetserve-runtime")
SYNTH = "builtin://synthetic?latency_ms=20&per_item_ms=0"
"""The synthetic encoder, slow enough (20 ms a batch) that concurrent requests batch."""
INFER = "/v2/models/proc/infer"
"""The infer path of the model the servers here serve (as "proc")."""
INFERENCE_TOKEN = "inference-token-1"
ADMIN_TOKEN = "admin-token-1-0123456789"
INTERNALS = ("Traceback", 'File "', "site-packages", ".py", str(Path.cwd()))
"""What an error body must never show: tracebacks, source paths."""


def free_ports(count: int) -> tuple[int, ...]:
    """`count` distinct loopback ports free now (the kernel may hand them out again later).

    All are held bound until each is picked: one just released may come back from the next
    bind, and a server given one port for two listeners refuses to start.
    """
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return tuple(int(sock.getsockname()[1]) for sock in sockets)


def free_port() -> int:
    """A loopback port free now (the kernel may hand it out again later)."""
    (port,) = free_ports(1)
    return port


def wait_ready(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 60) -> None:
    """Return once `url` is ready; `AssertionError` if `proc` exits or `deadline_s` passes."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"server exited with {proc.returncode}"
            raise AssertionError(msg)
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    msg = "server did not become ready"
    raise AssertionError(msg)


@dataclass(frozen=True)
class Server:
    """A runtime process on loopback."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]


@contextmanager
def running_server(
    args: Sequence[str] = (),
    *,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    port: int | None = None,
) -> Iterator[Server]:
    """`fleetserve-runtime serve` with `args`; stderr to `log` or a pipe.

    It listens on `port`, or on a free one when that is None.
    """
    port = free_port() if port is None else port
    sink = log.open("wb") if log is not None else subprocess.PIPE
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", str(port), "--device", "cpu", "--no-warmup", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=sink,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield Server(url, port, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
        if log is not None:
            sink.close()  # type: ignore[union-attr]


@contextmanager
def plain_server(log: Path) -> Iterator[Server]:
    """Defaults, except short HTTP timeouts and header limit, and debug logs to `log`."""
    args = [
        "--model", SYNTH, "--name", "proc", "--header-timeout-s", "2", "--body-timeout-s", "2",
        "--max-header-bytes", "4096", "--log-level", "debug", "--log-format", "json",
    ]  # fmt: skip
    with running_server(args, log=log) as running:
        yield running


@dataclass(frozen=True)
class Secured:
    """A server with inference auth and model control on, and its token files."""

    server: Server
    admin_url: str
    token_file: Path
    log: Path


@contextmanager
def secured_server(tmp: Path) -> Iterator[Secured]:
    """Bearer auth on inference (`INFERENCE_TOKEN`); model control on its own loopback listener.

    Its token files are written in `tmp`.
    """
    token_file, admin_file, log = tmp / "token", tmp / "admin-token", tmp / "stderr.log"
    token_file.write_text(INFERENCE_TOKEN + "\n")
    admin_file.write_text(ADMIN_TOKEN)
    port, admin_port = free_ports(2)
    args = [
        "--model", SYNTH, "--name", "proc", "--version", "v1",
        "--model-control", "explicit", "--admin-port", str(admin_port),
        "--admin-token-file", str(admin_file), "--allowed-model-uris", "builtin://synthetic",
    ]  # fmt: skip
    env = {"FLEETSERVE_AUTH_TOKEN_FILE": str(token_file)}
    with running_server(args, env=env, log=log, port=port) as running:
        yield Secured(running, f"http://127.0.0.1:{admin_port}", token_file, log)


def bearer(token: str) -> dict[str, str]:
    """The `Authorization` header that presents `token`."""
    return {"authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class Exchange:
    """What one raw connection saw."""

    data: bytes
    """Everything the server sent before it closed the connection."""
    closed_after_s: float
    """Seconds from connecting until the server closed the connection."""
    unsent: int
    """Pieces the client still had to send when the server answered or closed."""


def exchange(
    port: int, pieces: Sequence[bytes], *, gap_s: float = 0.0, timeout_s: float = 15.0
) -> Exchange:
    """Send `pieces` over one raw connection (`gap_s` apart), then read until it closes.

    Trickling stops as soon as the server answers or closes. A server that never closes
    fails the caller with `TimeoutError` after `timeout_s` of silence.
    """
    started = time.monotonic()
    data = b""
    unsent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        for sent, piece in enumerate(pieces):
            try:
                sock.sendall(piece)
            except OSError:
                unsent = len(pieces) - sent
                break
            if gap_s and select.select([sock], [], [], gap_s)[0]:
                unsent = len(pieces) - sent - 1
                break
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    return Exchange(data, time.monotonic() - started, unsent)


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of the first response in `data`."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split(" ")[1]), headers, body


def assert_clean_error(status: int, body: bytes, expected: int) -> dict[str, object]:
    """A JSON error body with a request id, and nothing from inside the server."""
    assert status == expected, body
    text = body.decode()
    for internal in INTERNALS:
        assert internal not in text, text
    error: dict[str, object] = json.loads(text)
    assert set(error) >= {"error", "request_id"}
    return error
