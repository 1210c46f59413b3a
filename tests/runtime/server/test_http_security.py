"""The HTTP surface of a real server process as an attacker sees it.

Model control only where enabled and only with the admin token, bearer auth on inference,
bounded tensors, headers and bodies, refused media types, errors without internals, request
logs with their trace ids. The servers are `conftest.py`'s.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fleetserve_runtime.testing.process import (
    ADMIN_TOKEN,
    CLI,
    INFER,
    INFERENCE_TOKEN,
    Secured,
    Server,
    assert_clean_error,
    bearer,
    exchange,
    free_port,
    parse_response,
)

BODY = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi there"]}]}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


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


def test_a_tenant_named_to_a_runtime_without_tenants_is_refused(
    plain: tuple[Server, Path],
) -> None:
    """No tenants table: a request naming a tenant gets 400 naming the header, never served."""
    server, _ = plain
    named = httpx.post(server.url + INFER, json=BODY, headers={"X-Fleetserve-Tenant": "gold"})
    assert named.status_code == 400, named.text
    message = named.json()["error"]  # the Open Inference Protocol's error: one string
    assert "x-fleetserve-tenant" in message
    assert "no tenants table" in message
    assert httpx.post(server.url + INFER, json=BODY).status_code == 200
