"""The semantic cache partitioned by tenant, over real HTTP on loopback.

A generative runtime with a tenants table and the semantic cache on: a tenant's repeat and
paraphrase hit its own entry; another tenant asking the very same is generated afresh.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.testing import make_config, metric_total
from tests.runtime.uvicorn_thread import uvicorn_thread

LLM = "builtin://synthetic-generate?per_token_ms=1&output_tokens=4&context_length=512"
INFERENCE_TOKEN = "inference-secret-0123456789"
TOKENS = {"alice": "alice-secret-0123456789", "bob": "bob-secret-0123456789"}
TABLE = {"tenants": [{"name": name, "tokens": [token]} for name, token in TOKENS.items()]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("semantic-tenants")
    table, token = tmp / "tenants.yaml", tmp / "token"
    table.write_text(json.dumps(TABLE))
    token.write_text(INFERENCE_TOKEN)
    config = make_config(
        model=LLM,
        auth_token_file=token,
        tenants={"file": table},
        semantic_cache={"encoder": "builtin://minilm-l6", "max_entries": 64},
    )
    with uvicorn_thread(create_app(config)) as port:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not httpx.get(f"{base}/v2/health/ready", timeout=30).is_success:
            assert time.monotonic() < deadline, "the model is not ready"
            time.sleep(0.05)
        yield base


def ask(base: str, tenant: str, prompt: str) -> None:
    response = httpx.post(
        f"{base}/v1/completions",
        json={"model": "test", "prompt": prompt, "temperature": 0, "max_tokens": 4},
        headers={"authorization": f"Bearer {TOKENS[tenant]}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text


def outcomes(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics").text
    name = "fleetserve_semantic_cache_requests_total"
    return {o: metric_total(text, name, outcome=o) for o in ("exact_hit", "semantic_hit", "miss")}


def test_a_tenant_never_gets_another_tenants_cached_answer(server: str) -> None:
    ask(server, "alice", "What is the capital of France?")
    ask(server, "alice", "What is the capital of France?")
    ask(server, "alice", "What is France's capital?")
    assert outcomes(server) == {"exact_hit": 1, "semantic_hit": 1, "miss": 1}
    ask(server, "bob", "What is the capital of France?")
    ask(server, "bob", "What is France's capital?")
    assert outcomes(server) == {"exact_hit": 1, "semantic_hit": 2, "miss": 2}
