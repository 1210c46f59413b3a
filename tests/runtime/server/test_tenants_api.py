"""Tenants over real HTTP on loopback: tokens, priorities, quotas, the header, cache isolation.

One generative runtime under uvicorn (`uvicorn_thread`) with an inference token and a
tenants table: `gold` may ask for high priority, `noisy` holds at most one request at a time,
`quiet` has no quota. A second runtime trusts `X-Fleetserve-Tenant` from its gateway.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.server.http_protocol import hardened_protocol
from fleetserve_runtime.testing import make_config
from tests.runtime.uvicorn_thread import uvicorn_thread

LLM = "builtin://synthetic-generate?per_token_ms=20&output_tokens=100000&context_length=512"
INFERENCE_TOKEN = "inference-secret-0123456789"
TOKENS = {
    "gold": "gold-secret-0123456789",
    "noisy": "noisy-secret-0123456789",
    "quiet": "quiet-secret-0123456789",
}
TABLE = {
    "tenants": [
        {"name": "gold", "tokens": [TOKENS["gold"]], "priorities": ["high", "normal"]},
        {"name": "noisy", "tokens": [TOKENS["noisy"]], "max_requests": 1, "weight": 1},
        {"name": "quiet", "tokens": [TOKENS["quiet"]], "weight": 2},
    ]
}
LIMIT_S = 30.0
COMPLETIONS = "/v1/completions"
HIGH = {"x-fleetserve-priority": "high"}


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@contextmanager
def serving(tmp: Path, **tenants: Any) -> Iterator[str]:
    """A generative runtime with the tenants table under uvicorn; yields its base URL."""
    table, token = tmp / "tenants.yaml", tmp / "token"
    table.write_text(json.dumps(TABLE))
    token.write_text(INFERENCE_TOKEN)
    config = make_config(model=LLM, auth_token_file=token, tenants={"file": table, **tenants})
    http = hardened_protocol(header_timeout_s=10.0, max_header_bytes=16_384)
    with uvicorn_thread(create_app(config), loop="uvloop", http=http) as port:
        base = f"http://127.0.0.1:{port}"
        ready = f"{base}/v2/health/ready"
        wait_for(lambda: httpx.get(ready, timeout=LIMIT_S).is_success, "the model is not ready")
        yield base


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("tenants")) as base:
        yield base


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("gateway"), trust_header=True) as base:
        yield base


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def complete(
    base: str, token: str, *, headers: dict[str, str] | None = None, **fields: Any
) -> httpx.Response:
    body = {"model": "test", "prompt": "hello there", "max_tokens": 2, **fields}
    return httpx.post(
        base + COMPLETIONS, json=body, headers={**auth(token), **(headers or {})},
        timeout=LIMIT_S,
    )  # fmt: skip


def test_a_tenant_token_authenticates_and_a_wrong_one_does_not(server: str) -> None:
    assert complete(server, TOKENS["quiet"]).status_code == 200
    assert complete(server, INFERENCE_TOKEN).status_code == 200
    refused = complete(server, "quiet-secret-0123456780")
    assert refused.status_code == 401, refused.text


def test_a_tenant_gets_only_its_allowed_priorities(server: str) -> None:
    assert complete(server, TOKENS["gold"], headers=HIGH).status_code == 200
    refused = complete(server, TOKENS["quiet"], headers=HIGH)
    assert refused.status_code == 403, refused.text
    message = refused.json()["error"]["message"]
    assert "x-fleetserve-priority high is not allowed" in message
    assert "quiet" in message
    body_field = httpx.post(
        f"{server}/v2/models/test/generate",
        json={"text_input": "hi", "parameters": {"max_tokens": 2, "priority": "high"}},
        headers=auth(TOKENS["noisy"]),
        timeout=LIMIT_S,
    )
    assert body_field.status_code == 403, body_field.text
    assert "parameters.priority" in body_field.json()["error"]


def test_a_tenant_over_its_quota_gets_429_while_another_is_served(server: str) -> None:
    long_stream = {
        "model": "test", "prompt": "stream on", "max_tokens": 150, "stream": True,
    }  # fmt: skip
    with (
        httpx.Client(timeout=LIMIT_S) as client,
        client.stream(
            "POST", server + COMPLETIONS, json=long_stream, headers=auth(TOKENS["noisy"])
        ) as held,
    ):
        assert held.status_code == 200
        chunks = held.iter_bytes()  # kept: a dropped iterator closes the stream
        next(chunks)
        over = complete(server, TOKENS["noisy"])
        served = complete(server, TOKENS["quiet"])
    assert over.status_code == 429, over.text
    assert int(over.headers["retry-after"]) >= 1
    assert "noisy" in over.json()["error"]["message"]
    assert "max_requests" in over.json()["error"]["message"]
    assert served.status_code == 200, served.text
    # The held stream ended: its place in the quota is free again.
    assert complete(server, TOKENS["noisy"]).status_code == 200
    metrics = httpx.get(f"{server}/metrics", timeout=LIMIT_S).text
    assert (
        'fleetserve_tenant_rejections_total{model="test",tenant="noisy",track="stable"} 1.0'
        in metrics
    )
    assert (
        'fleetserve_tenant_rejections_total{model="test",tenant="quiet",track="stable"} 0.0'
        in metrics
    )
    assert 'tenant="_default"' in metrics


def test_the_tenant_header_is_refused_unless_the_gateway_is_trusted(
    server: str, gateway: str
) -> None:
    refused = complete(server, TOKENS["quiet"], headers={"x-fleetserve-tenant": "gold"})
    assert refused.status_code == 400, refused.text
    assert "x-fleetserve-tenant" in refused.json()["error"]["message"]
    named = complete(gateway, INFERENCE_TOKEN, headers={"x-fleetserve-tenant": "gold", **HIGH})
    assert named.status_code == 200, named.text
    unknown = complete(gateway, INFERENCE_TOKEN, headers={"x-fleetserve-tenant": "nobody"})
    assert unknown.status_code == 400, unknown.text


def test_two_tenants_never_share_prefix_cache_blocks(server: str) -> None:
    prompt = " ".join(f"isolated{i}" for i in range(40))

    def cached(token: str, salt: str | None = None) -> int:
        extra: dict[str, Any] = {} if salt is None else {"cache_salt": salt}
        answer = complete(server, token, prompt=prompt, **extra)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached(TOKENS["quiet"]) == 0
    assert cached(TOKENS["quiet"]) > 0
    assert cached(TOKENS["gold"]) == 0
    assert cached(TOKENS["gold"], salt="shared") == 0
    assert cached(TOKENS["quiet"], salt="shared") == 0
    assert cached(INFERENCE_TOKEN) == 0
