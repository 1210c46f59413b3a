"""The real CLI as a process: HTTP over loopback, env configuration, clean shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fleetserve_runtime.cli import EXIT_LOAD_FAILED

CLI = Path(sys.executable).with_name("fleetserve-runtime")
SYNTH = "builtin://synthetic?latency_ms=20&per_item_ms=0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail("server did not become ready")


@dataclass(frozen=True)
class Server:
    """A runtime process on loopback."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]


@contextmanager
def running_server(
    args: Sequence[str] = (), *, env: dict[str, str] | None = None, log: Path | None = None
) -> Iterator[Server]:
    """`fleetserve-runtime serve` on a free port with `args`; stderr to `log` or a pipe."""
    port = free_port()
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


@pytest.fixture
def server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A runtime process configured through FLEETSERVE_* variables and flags."""
    env = {
        "FLEETSERVE_MODEL": SYNTH,
        "FLEETSERVE_NAME": "proc",
        "FLEETSERVE_BATCHING_MAX_BATCH_SIZE": "8",
        "FLEETSERVE_TRACK": "canary",
    }
    with running_server(env=env) as running:
        yield running.url, running.proc


def test_serves_batches_over_loopback(server: tuple[str, subprocess.Popen[bytes]]) -> None:
    """Concurrent HTTP clients get answers, batched, labelled with the configured track."""
    url, _ = server
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi there"]}]}

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            responses = await asyncio.gather(
                *(client.post("/v2/models/proc/infer", json=body) for _ in range(24))
            )
        return [r.status_code for r in responses]

    assert asyncio.run(burst()) == [200] * 24
    metrics = httpx.get(f"{url}/metrics").text
    assert 'track="canary"' in metrics
    size_sum = [
        line for line in metrics.splitlines() if line.startswith("fleetserve_batch_size_sum")
    ]
    count = [
        line for line in metrics.splitlines() if line.startswith("fleetserve_batch_size_count")
    ]
    assert float(size_sum[0].split()[-1]) == 24
    assert float(count[0].split()[-1]) < 24


def test_sigterm_shuts_down_gracefully(server: tuple[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM runs the lifespan shutdown, then the process ends by that signal.

    uvicorn re-raises the captured signal after its graceful shutdown, so the exit status
    says "terminated by SIGTERM", as a kubelet expects.
    """
    _, proc = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) in (0, -signal.SIGTERM)
    assert proc.stderr is not None
    assert b"Application shutdown complete" in proc.stderr.read()


# -- the HTTP surface as an attacker sees it ----------------------------------------------

INFER = "/v2/models/proc/infer"
BODY = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi there"]}]}
INFERENCE_TOKEN = "inference-token-1"
ADMIN_TOKEN = "admin-token-1-0123456789"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
INTERNALS = ("Traceback", 'File "', "site-packages", ".py", str(Path.cwd()))


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


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """Defaults, except short HTTP timeouts and header limit, and debug logs to a file."""
    log = tmp_path_factory.mktemp("plain") / "stderr.log"
    args = [
        "--model", SYNTH, "--name", "proc", "--header-timeout-s", "2", "--body-timeout-s", "2",
        "--max-header-bytes", "4096", "--log-level", "debug", "--log-format", "json",
    ]  # fmt: skip
    with running_server(args, log=log) as running:
        yield running, log


@dataclass(frozen=True)
class Secured:
    """A server with inference auth and model control on, and its token files."""

    server: Server
    admin_url: str
    token_file: Path
    log: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """Bearer auth on inference; model control on its own loopback listener."""
    tmp = tmp_path_factory.mktemp("secured")
    token_file, admin_file, log = tmp / "token", tmp / "admin-token", tmp / "stderr.log"
    token_file.write_text(INFERENCE_TOKEN + "\n")
    admin_file.write_text(ADMIN_TOKEN)
    admin_port = free_port()
    args = [
        "--model", SYNTH, "--name", "proc", "--version", "v1",
        "--model-control", "explicit", "--admin-port", str(admin_port),
        "--admin-token-file", str(admin_file), "--allowed-model-uris", "builtin://synthetic",
    ]  # fmt: skip
    env = {"FLEETSERVE_AUTH_TOKEN_FILE": str(token_file)}
    with running_server(args, env=env, log=log) as running:
        yield Secured(running, f"http://127.0.0.1:{admin_port}", token_file, log)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_model_control_does_not_exist_by_default(plain: tuple[Server, Path]) -> None:
    """Without --model-control the repository API is absent: 404, the model untouched."""
    server, _ = plain
    for path in ("/v2/repository/models/proc/load", "/v2/repository/models/proc/unload"):
        response = httpx.post(
            server.url + path, json={"parameters": {"version": "v2", "uri": "builtins:print"}}
        )
        assert_clean_error(response.status_code, response.content, 404)
    assert httpx.get(server.url + "/v2").json()["extensions"] == []
    assert httpx.post(server.url + INFER, json=BODY).status_code == 200


def test_model_control_lives_only_on_the_admin_listener(secured: Secured) -> None:
    """An authenticated caller finds no repository API on the inference port."""
    load = {"parameters": {"version": "v2", "uri": "builtin://synthetic?dim=4"}}
    response = httpx.post(
        secured.server.url + "/v2/repository/models/proc/load",
        json=load,
        headers=bearer(INFERENCE_TOKEN),
    )
    assert_clean_error(response.status_code, response.content, 404)
    listening = [
        json.loads(line) for line in secured.log.read_text().splitlines() if '"listening"' in line
    ]
    admin_port = secured.admin_url.rsplit(":", 1)[1]
    assert {"listener": "model control", "address": f"127.0.0.1:{admin_port}"}.items() <= (
        listening[1].items()
    )


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-token"),
        pytest.param(bearer("wrong"), id="wrong-token"),
        pytest.param(bearer(INFERENCE_TOKEN), id="inference-token"),
        pytest.param({"authorization": f"Basic {ADMIN_TOKEN}"}, id="not-bearer"),
    ],
)
def test_model_control_needs_the_admin_token(secured: Secured, headers: dict[str, str]) -> None:
    """Every model-control call without the admin token is 401 and changes nothing."""
    load = {"parameters": {"version": "v9", "uri": "builtin://synthetic?dim=4"}}
    for path in ("/v2/repository/models/proc/load", "/v2/repository/models/proc/unload"):
        response = httpx.post(secured.admin_url + path, json=load, headers=headers)
        assert_clean_error(response.status_code, response.content, 401)
        assert response.headers["www-authenticate"].startswith("Bearer")
    versions = httpx.get(secured.server.url + "/v2/models/proc", headers=bearer(INFERENCE_TOKEN))
    assert versions.json()["versions"] == ["v1"]


@pytest.mark.parametrize(
    "uri",
    [
        pytest.param("builtins:print", id="module-factory"),
        pytest.param("fleetserve_runtime.testing:exploding_handler", id="module-not-listed"),
        pytest.param("file:///tmp", id="handler-directory"),
        pytest.param("builtin://synthetic/../../x", id="dot-segments"),
        pytest.param("builtin://minilm-l6", id="not-listed"),
    ],
)
def test_model_control_refuses_uris_off_the_allowlist(secured: Secured, uri: str) -> None:
    """A URI the allowlist does not name is 403 with the reason; the served model stays."""
    response = httpx.post(
        secured.admin_url + "/v2/repository/models/proc/load",
        json={"parameters": {"version": "v2", "uri": uri}},
        headers=bearer(ADMIN_TOKEN),
    )
    error = assert_clean_error(response.status_code, response.content, 403)
    assert "allowed_model_uris" in str(error["error"]) or "segments" in str(error["error"])
    answer = httpx.post(secured.server.url + INFER, json=BODY, headers=bearer(INFERENCE_TOKEN))
    assert answer.json()["model_version"] == "v1"


def test_model_control_loads_allowed_uris(secured: Secured) -> None:
    """With the admin token an allowed URI loads and serves; switching back and unloading work."""
    admin = httpx.Client(base_url=secured.admin_url, headers=bearer(ADMIN_TOKEN), timeout=30)
    user = httpx.Client(base_url=secured.server.url, headers=bearer(INFERENCE_TOKEN))
    with admin, user:
        load = admin.post(
            "/v2/repository/models/proc/load",
            json={"parameters": {"version": "v2", "uri": "builtin://synthetic?dim=4"}},
        )
        swapped = user.post(INFER, json=BODY).json()
        back = admin.post("/v2/repository/models/proc/load", json={"parameters": {"version": "v1"}})
        released = admin.post("/v2/repository/models/proc/unload")
    assert load.json() == {"name": "proc", "active_version": "v2"}
    assert (swapped["model_version"], swapped["outputs"][0]["shape"]) == ("v2", [1, 4])
    assert back.json() == {"name": "proc", "active_version": "v1"}
    assert released.json() == {"name": "proc", "released_version": "v2"}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param(["--model-control", "explicit"], "admin_token_file", id="no-token"),
        pytest.param(
            ["--model-control", "explicit", "--admin-token-file", __file__],
            "allowed_model_uris",
            id="no-allowlist",
        ),
    ],
)
def test_model_control_refuses_to_start_unprotected(args: list[str], field: str) -> None:
    """--model-control explicit without a token file or an allowlist stops start-up, saying so."""
    done = subprocess.run(
        [str(CLI), "serve", "--port", str(free_port()), *args],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert field in done.stderr.decode()


def test_inference_needs_the_bearer_token(secured: Secured) -> None:
    """Without the token: 401, `WWW-Authenticate: Bearer` and a JSON error; with it: 200."""
    url = secured.server.url
    missing = httpx.post(url + INFER, json=BODY)
    wrong = httpx.post(url + INFER, json=BODY, headers=bearer("nope"))
    metadata = httpx.get(url + "/v2/models/proc")
    assert_clean_error(missing.status_code, missing.content, 401)
    assert missing.headers["www-authenticate"] == 'Bearer realm="fleetserve"'
    assert_clean_error(wrong.status_code, wrong.content, 401)
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert metadata.status_code == 401
    assert httpx.post(url + INFER, json=BODY, headers=bearer(INFERENCE_TOKEN)).status_code == 200


def test_probes_and_metrics_need_no_token(secured: Secured) -> None:
    """The kubelet and Prometheus reach their endpoints without credentials."""
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
        assert httpx.get(secured.server.url + path).status_code == 200, path


def test_a_rotated_token_file_takes_effect(secured: Secured) -> None:
    """Replacing the token file (as a Secret update does) switches tokens without a restart."""
    url = secured.server.url + INFER
    rotated = secured.token_file.with_name("token.new")
    rotated.write_text("inference-token-2")
    original = secured.token_file.read_text()
    os.replace(rotated, secured.token_file)
    try:
        old = httpx.post(url, json=BODY, headers=bearer(INFERENCE_TOKEN))
        new = httpx.post(url, json=BODY, headers=bearer("inference-token-2"))
    finally:
        secured.token_file.write_text(original)
    assert old.status_code == 401
    assert new.status_code == 200
    assert httpx.post(url, json=BODY, headers=bearer(INFERENCE_TOKEN)).status_code == 200


def _live_latency_during(port: int, body: bytes, count: int = 16) -> tuple[float, list[int]]:
    """Seconds `/v2/health/live` takes while `count` posts of `body` wait to be decoded.

    Each post goes over its own raw connection, all but its last byte first; once the server
    has had time to read that far, the last bytes go out together, so all `count` bodies
    become complete at once, and the probe follows. Returns the probe's latency and the
    statuses the posts got.
    """
    head = (
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    connections = [socket.create_connection(("127.0.0.1", port), timeout=120) for _ in range(count)]
    try:
        with ThreadPoolExecutor(count) as senders:
            list(senders.map(lambda sock: sock.sendall(head + body[:-1]), connections))
        time.sleep(0.5)
        for sock in connections:
            sock.sendall(body[-1:])
        started = time.monotonic()
        live = httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=120)
        latency = time.monotonic() - started
        assert live.status_code == 200
        return latency, [int(sock.makefile("rb").readline().split()[1]) for sock in connections]
    finally:
        for sock in connections:
            sock.close()


def test_live_answers_fast_while_huge_shapes_arrive(plain: tuple[Server, Path]) -> None:
    """16 bodies of 0.2 MB declaring absurd shapes are refused cheaply; live stays < 500 ms."""
    server, _ = plain
    tensor = {"name": "text", "datatype": "BYTES", "shape": [4_294_967_295] * 18_000, "data": ["a"]}
    body = json.dumps({"inputs": [tensor]}).encode()
    assert 150_000 < len(body) < 250_000
    latency, codes = _live_latency_during(server.port, body)
    assert latency < 0.5
    assert codes == [400] * 16
    refused = httpx.post(
        server.url + INFER, content=body, headers={"content-type": "application/json"}
    )
    assert "max_tensor_rank" in refused.json()["error"]


@pytest.mark.parametrize(
    ("shape", "status", "limit"),
    [
        pytest.param([300, 4000], 413, "max_tensor_elements", id="elements"),
        pytest.param([1] * 9, 400, "max_tensor_rank", id="rank"),
    ],
)
def test_tensor_limits_are_named(
    plain: tuple[Server, Path], shape: list[int], status: int, limit: str
) -> None:
    """A shape over a limit is refused before its data is looked at, naming the limit."""
    server, _ = plain
    tensor = {"name": "text", "datatype": "BYTES", "shape": shape, "data": ["a"]}
    response = httpx.post(server.url + INFER, json={"inputs": [tensor]})
    error = assert_clean_error(response.status_code, response.content, status)
    assert limit in str(error["error"])


def test_trickled_headers_are_cut_off(plain: tuple[Server, Path]) -> None:
    """A request whose headers trickle in is answered 408 and closed after header_timeout_s."""
    server, _ = plain
    pieces = [b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: "] + [b"a"] * 60
    seen = exchange(server.port, pieces, gap_s=0.25)
    status, headers, body = parse_response(seen.data)
    assert seen.closed_after_s > 1.5, "not before header_timeout_s (2 s)"
    assert seen.unsent > 0, "the server cut the client off while it still trickled"
    error = assert_clean_error(status, body, 408)
    assert "within 2 s (header_timeout_s)" in str(error["error"])
    assert headers["connection"] == "close"


def test_a_silent_connection_is_closed(plain: tuple[Server, Path]) -> None:
    """A connection that never sends a byte is closed after header_timeout_s."""
    server, _ = plain
    seen = exchange(server.port, [])
    assert seen.data == b""
    assert seen.closed_after_s > 1.5, "not before header_timeout_s (2 s)"


def test_trickled_body_gets_408(plain: tuple[Server, Path]) -> None:
    """A body that trickles in is answered 408 after body_timeout_s, and the connection closed."""
    server, _ = plain
    head = (
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 200\r\n\r\n"
    ).encode()
    seen = exchange(server.port, [head] + [b" "] * 60, gap_s=0.25)
    status, _, body = parse_response(seen.data)
    assert seen.closed_after_s > 1.5, "not before body_timeout_s (2 s)"
    assert seen.unsent > 0, "the server cut the client off while it still trickled"
    error = assert_clean_error(status, body, 408)
    assert "within 2 s (body_timeout_s)" in str(error["error"])


@pytest.mark.parametrize(
    "pieces",
    [
        pytest.param([b"GET /v2/health/live HTTP/1.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n"]),
        pytest.param(
            [b"GET /v2/health/live HTTP/1.1\r\nX-Endless: "] + [b"a" * 1000] * 8,
            id="unfinished-line",
        ),
    ],
)
def test_oversized_headers_get_431(plain: tuple[Server, Path], pieces: list[bytes]) -> None:
    """Headers over max_header_bytes get 431, even one header line that never ends."""
    server, _ = plain
    status, _, body = parse_response(exchange(server.port, pieces, gap_s=0.05).data)
    error = assert_clean_error(status, body, 431)
    assert "max_header_bytes" in str(error["error"])


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        pytest.param({"content-type": "application/x-www-form-urlencoded"}, "application/json"),
        pytest.param({"content-type": "text/plain"}, "application/json", id="text-plain"),
        pytest.param({"content-type": "multipart/form-data; boundary=x"}, "application/json"),
        pytest.param({"content-type": "application/json; charset=latin-1"}, "UTF-8"),
    ],
)
def test_non_json_posts_never_reach_the_model(
    plain: tuple[Server, Path], headers: dict[str, str], reason: str
) -> None:
    """Form posts and other media types get 415 naming what is accepted; nothing is computed."""
    server, _ = plain

    def batches() -> float:
        lines = httpx.get(server.url + "/metrics").text.splitlines()
        return sum(float(line.split()[-1]) for line in lines if "batch_size_count" in line)

    before = batches()
    response = httpx.post(server.url + INFER, content=json.dumps(BODY).encode(), headers=headers)
    error = assert_clean_error(response.status_code, response.content, 415)
    assert reason in str(error["error"])
    assert batches() == before


@pytest.mark.parametrize("path", ["/docs", "/openapi.json", "/redoc"])
def test_api_docs_are_off_by_default(plain: tuple[Server, Path], path: str) -> None:
    """The schema of the API is not published unless --api-docs asks for it."""
    server, _ = plain
    response = httpx.get(server.url + path)
    assert_clean_error(response.status_code, response.content, 404)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(b"GARBAGE / HTTP/1.1\r\n\r\n", 400, id="bad-method"),
        pytest.param(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400, id="bad-header"),
        pytest.param(b"GET /nowhere HTTP/1.1\r\nConnection: close\r\n\r\n", 404, id="no-route"),
        pytest.param(
            f"GET {INFER} HTTP/1.1\r\nConnection: close\r\n\r\n".encode(), 405, id="method"
        ),
        pytest.param(
            f"POST {INFER} HTTP/1.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 9\r\nConnection: close\r\n\r\n{not json".encode(),
            400,
            id="bad-json",
        ),
        pytest.param(
            f"POST {INFER} HTTP/1.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\nzz\r\n".encode(),
            400,
            id="bad-chunk",
        ),
    ],
)
def test_errors_are_json_without_internals(
    plain: tuple[Server, Path], request_bytes: bytes, status: int
) -> None:
    """Malformed HTTP, unknown routes and bad bodies: JSON errors, no traceback or path."""
    server, _ = plain
    code, headers, body = parse_response(exchange(server.port, [request_bytes]).data)
    assert_clean_error(code, body, status)
    assert headers["content-type"] == "application/json"


def test_request_logs_carry_trace_ids(plain: tuple[Server, Path]) -> None:
    """Log records of a request carry its X-Request-ID and traceparent; times have ms."""
    server, log = plain
    headers = {"x-request-id": "trace-me-42", "traceparent": TRACEPARENT}
    assert httpx.post(server.url + INFER, json=BODY, headers=headers).status_code == 200
    deadline = time.monotonic() + 10
    records: list[dict[str, object]] = []
    while not records and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = log.read_text().splitlines()
        records = [json.loads(line) for line in lines if "trace-me-42" in line]
    assert records
    for record in records:
        assert record["request_id"] == "trace-me-42"
        assert record["traceparent"] == TRACEPARENT
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", str(record["ts"]))
    assert any(record.get("path") == INFER for record in records)


# -- connections that clients try to hold open -----------------------------------------------

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


SLOW_IMPORT = """
import time
time.sleep(3)
from fleetserve_runtime.models.synthetic import SyntheticHandler

def create_handler(name, version, max_sequence_length):
    return SyntheticHandler(name, version, max_sequence_length=max_sequence_length)
"""


@pytest.mark.timeout(90)
def test_a_slow_handler_import_does_not_stall_live(tmp_path: Path) -> None:
    """Loading a handler whose import takes 3 s: /v2/health/live keeps answering 200 at once.

    Resolving a URI imports user code; on the event loop it stalled every request, and the
    loop-stall check (1 s here) failed liveness.
    """
    package = tmp_path / "slowpkg"
    package.mkdir()
    (package / "handler.py").write_text(SLOW_IMPORT)
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN_TOKEN)
    admin_port = free_port()
    uri = f"file://{package}"
    args = [
        "--model", SYNTH, "--name", "proc", "--health-loop-stall-s", "1",
        "--model-control", "explicit", "--admin-port", str(admin_port),
        "--admin-token-file", str(admin_file), "--allowed-model-uris", uri,
    ]  # fmt: skip
    with running_server(args) as server, ThreadPoolExecutor(1) as loader:
        loading = loader.submit(
            httpx.post,
            f"http://127.0.0.1:{admin_port}/v2/repository/models/proc/load",
            json={"parameters": {"version": "v2", "uri": uri}},
            headers=bearer(ADMIN_TOKEN),
            timeout=60,
        )
        probes: list[int | str] = []
        while not loading.done():
            try:
                probes.append(httpx.get(server.url + "/v2/health/live", timeout=0.9).status_code)
            except httpx.TimeoutException:
                probes.append("timed out")
            time.sleep(0.1)
        assert loading.result().json() == {"name": "proc", "active_version": "v2"}
    assert set(probes) == {200}, probes
    assert len(probes) > 10, "the load ended before it could be watched"


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("builtin://synthetic?dim=not-a-number", id="bad-parameter"),
        pytest.param("builtin://no-such-model", id="unknown-builtin"),
    ],
)
def test_a_model_that_cannot_load_stops_the_process(model: str) -> None:
    """The first load failing exits with EXIT_LOAD_FAILED and the reason on stderr.

    A replica that stayed up unready would only be noticed by a progress deadline; exiting
    makes the kubelet report a crash loop with the reason, at once.
    """
    done = subprocess.run(
        [str(CLI), "serve", "--port", str(free_port()), "--model", model, "--log-format", "text"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_LOAD_FAILED
    assert "model load failed" in done.stderr.decode()
