"""What one caller may take from the others: output tokens, `ignore_eos`, priority, deadline.

In process (ASGI transport, real lifespan): the synthetic LLM on the generation routes, the
synthetic encoder on the OIP infer route. Priority above normal and a deadline above the
default are granted only to a request bearing the priority token; anyone else gets a 403
naming the header or field, on both surfaces.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fleetserve_runtime.testing import error_message, infer_request
from fleetserve_runtime.testing.asgi import serve
from fleetserve_runtime.testing.process import bearer

CONTEXT = 256
LLM = f"builtin://synthetic-generate?per_token_ms=0&output_tokens=100000&context_length={CONTEXT}"
CHAT = "/v1/chat/completions"
GENERATE = "/v2/models/test/generate"
INFER = "/v2/models/test/infer"
PRIORITY_TOKEN = "priority-secret-0123456789"
INFERENCE_TOKEN = "inference-secret-0123456789"


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "test", "messages": [{"role": "user", "content": "go on"}], **fields}


def v2(**parameters: Any) -> dict[str, Any]:
    return infer_request(["hello"], **parameters)


@pytest.fixture
def token_files(tmp_path: Path) -> dict[str, Path]:
    files = {"priority_token_file": PRIORITY_TOKEN, "auth_token_file": INFERENCE_TOKEN}
    paths = {}
    for name, token in files.items():
        paths[name] = tmp_path / name
        paths[name].write_text(token)
    return paths


# -- output tokens and ignore_eos ----------------------------------------------------------


async def test_unset_max_tokens_takes_the_server_default() -> None:
    """No `max_tokens`, a model that never stops: the default ends it, not the context."""
    async with serve(LLM, generation={"default_max_tokens": 5}) as (client, _):
        answer = await client.post(CHAT, json=chat())
        generated = await client.post(GENERATE, json={"text_input": "go on"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 5
    assert answer.json()["choices"][0]["finish_reason"] == "length"
    assert generated.json()["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        pytest.param(CHAT, chat(max_tokens=9), "max_tokens", id="chat"),
        pytest.param(
            CHAT, chat(max_completion_tokens=9), "max_completion_tokens", id="chat-completion"
        ),
        pytest.param(
            "/v1/completions",
            {"model": "test", "prompt": "go", "max_tokens": 9},
            "max_tokens",
            id="completions",
        ),
        pytest.param(
            GENERATE,
            {"text_input": "go", "parameters": {"max_tokens": 9}},
            "parameters.max_tokens",
            id="generate",
        ),
    ],
)
async def test_max_tokens_over_the_cap_is_a_400_naming_both(
    path: str, body: dict[str, Any], field: str
) -> None:
    async with serve(LLM, generation={"default_max_tokens": 4, "max_output_tokens": 8}) as (
        client,
        _,
    ):
        response = await client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    message = error_message(response.json())
    assert f"{field} 9" in message
    assert "generation.max_output_tokens" in message
    assert "8" in message
    if not isinstance(error, str):
        assert error["param"] == field


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        pytest.param(CHAT, chat(ignore_eos=True, max_tokens=4), "ignore_eos", id="chat"),
        pytest.param(
            GENERATE,
            {"text_input": "go", "parameters": {"ignore_eos": True, "max_tokens": 4}},
            "parameters.ignore_eos",
            id="generate",
        ),
    ],
)
async def test_ignore_eos_is_refused_unless_allowed(
    path: str, body: dict[str, Any], field: str
) -> None:
    async with serve(LLM) as (client, _):
        refused = await client.post(path, json=body)
    async with serve(LLM, generation={"allow_ignore_eos": True}) as (client, _):
        allowed = await client.post(path, json=body)
    assert refused.status_code == 400, refused.text
    message = error_message(refused.json())
    assert field in message
    assert "generation.allow_ignore_eos" in message
    assert allowed.status_code == 200, allowed.text


async def test_a_short_request_is_not_starved_by_an_unbounded_one() -> None:
    """One running slot, a first caller who sets no `max_tokens` on a model that never stops.

    Without a server default the first generation runs to its 20k-token context (minutes at
    this pace) and the second caller waits behind it; with it, both complete. The bound only
    keeps a regression from hanging the suite.
    """
    model = "builtin://synthetic-generate?per_token_ms=10&output_tokens=100000&context_length=20000"
    config = {"max_running_sequences": 1, "default_max_tokens": 8}
    async with serve(model, generation=config) as (client, _):
        first = asyncio.create_task(client.post(CHAT, json=chat()))
        await asyncio.sleep(0.2)
        second = client.post(
            CHAT, json=chat(max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        )
        short, unbounded = await asyncio.wait_for(asyncio.gather(second, first), timeout=60)
    assert short.status_code == unbounded.status_code == 200
    assert short.json()["usage"]["completion_tokens"] == 5


# -- priority and deadline ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "headers", "named"),
    [
        pytest.param(
            CHAT, chat(max_tokens=2), {"x-fleetserve-priority": "high"},
            "x-fleetserve-priority high", id="chat-priority",
        ),
        pytest.param(
            CHAT, chat(max_tokens=2), {"x-fleetserve-timeout-ms": "600000"},
            "x-fleetserve-timeout-ms 600000", id="chat-timeout",
        ),
        pytest.param(
            GENERATE, {"text_input": "go", "parameters": {"max_tokens": 2, "priority": "high"}},
            {}, "parameters.priority high", id="generate-priority",
        ),
        pytest.param(
            GENERATE, {"text_input": "go", "parameters": {"max_tokens": 2, "timeout_ms": 600000}},
            {}, "parameters.timeout_ms 600000", id="generate-timeout",
        ),
    ],
)  # fmt: skip
async def test_raising_priority_or_deadline_on_the_generation_routes_needs_the_token(
    token_files: dict[str, Path],
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    named: str,
) -> None:
    """403 naming the header or field for anyone else; the token holder is served."""
    async with serve(LLM, priority_token_file=token_files["priority_token_file"]) as (client, _):
        refused = await client.post(path, json=body, headers=headers)
        forged = await client.post(path, json=body, headers={**headers, **bearer("x" * 20)})
        granted = await client.post(path, json=body, headers={**headers, **bearer(PRIORITY_TOKEN)})
    for answer in (refused, forged):
        assert answer.status_code == 403, answer.text
        message = error_message(answer.json())
        assert named in message
        assert "priority_token_file" in message
    assert granted.status_code == 200, granted.text


@pytest.mark.parametrize(
    ("body", "headers", "named"),
    [
        pytest.param(v2(), {"x-fleetserve-priority": "high"}, "x-fleetserve-priority", id="header"),
        pytest.param(v2(priority="high"), {}, "parameters.priority", id="body"),
        pytest.param(
            v2(), {"x-fleetserve-timeout-ms": "30000"}, "x-fleetserve-timeout-ms", id="timeout"
        ),
        pytest.param(v2(timeout_ms=30000), {}, "parameters.timeout_ms", id="body-timeout"),
    ],
)  # fmt: skip
async def test_raising_priority_or_deadline_on_the_encoder_routes_needs_the_token(
    token_files: dict[str, Path], body: dict[str, Any], headers: dict[str, str], named: str
) -> None:
    """The OIP infer route takes the same decision (its default deadline is the queue's)."""
    async with serve(
        "builtin://synthetic?latency_ms=0&per_item_ms=0",
        priority_token_file=token_files["priority_token_file"],
    ) as (client, _):
        refused = await client.post(INFER, json=body, headers=headers)
        granted = await client.post(INFER, json=body, headers={**headers, **bearer(PRIORITY_TOKEN)})
        lowered = await client.post(
            INFER,
            json=v2(priority="low", timeout_ms=4000),
            headers={"x-fleetserve-priority": "low"},
        )
    assert refused.status_code == 403, refused.text
    assert named in refused.json()["error"]
    assert granted.status_code == 200, granted.text
    assert lowered.status_code == 200, lowered.text


async def test_lowering_needs_no_token() -> None:
    """`low` and a deadline under the default are any caller's to ask for."""
    headers = {"x-fleetserve-priority": "low", "x-fleetserve-timeout-ms": "60000"}
    async with serve(LLM) as (client, _):
        response = await client.post(CHAT, json=chat(max_tokens=2), headers=headers)
    assert response.status_code == 200, response.text


async def test_the_priority_token_also_authenticates_inference(
    token_files: dict[str, Path],
) -> None:
    """With both token files: either token infers; only the priority token raises priority."""
    headers = {"x-fleetserve-priority": "high"}
    async with serve(LLM, **token_files) as (client, _):
        anonymous = await client.post(CHAT, json=chat(max_tokens=2))
        plain = await client.post(CHAT, json=chat(max_tokens=2), headers=bearer(INFERENCE_TOKEN))
        plain_high = await client.post(
            CHAT, json=chat(max_tokens=2), headers={**headers, **bearer(INFERENCE_TOKEN)}
        )
        privileged = await client.post(
            CHAT, json=chat(max_tokens=2), headers={**headers, **bearer(PRIORITY_TOKEN)}
        )
    assert anonymous.status_code == 401
    assert plain.status_code == 200, plain.text
    assert plain_high.status_code == 403, plain_high.text
    assert privileged.status_code == 200, privileged.text
