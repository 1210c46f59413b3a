"""The OIP generate extension in process: `generate`, `generate_stream`, versions, errors.

Errors keep the runtime's own shape `{"error": message, "request_id"}`; a prompt over the
context is a 400 here too.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fleetserve_runtime.testing.asgi import serve

CONTEXT = 64
LLM = f"builtin://synthetic-generate?per_token_ms=0&output_tokens=10&context_length={CONTEXT}"
GENERATE = "/v2/models/test/generate"


def request(text: str = "the river runs", **parameters: Any) -> dict[str, Any]:
    return {"text_input": text, "parameters": {"temperature": 0, **parameters}}


def stream_events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = response.text.split("\n\n")
    assert blocks[-1] == ""
    assert all(block.startswith("data: ") for block in blocks[:-1])
    return [json.loads(block.removeprefix("data: ")) for block in blocks[:-1]]


async def test_generate_answers_text_output_with_finish_and_usage() -> None:
    """`text_output`, the model's name and version, why it stopped, and the token counts."""
    async with serve(LLM) as (client, _):
        response = await client.post(GENERATE, json={**request(max_tokens=4), "id": "req-7"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_name"] == "test"
    assert body["model_version"] == "v1"
    assert body["id"] == "req-7"
    assert len(body["text_output"].split()) == 4
    assert body["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["prompt_tokens"] > 0


async def test_generate_stream_events_add_up_to_the_whole_answer() -> None:
    """One event per text delta, then a last event with the finish reason; no [DONE]."""
    async with serve(LLM) as (client, _):
        whole = (await client.post(GENERATE, json=request())).json()
        streamed = await client.post("/v2/models/test/generate_stream", json=request())
    events = stream_events(streamed)
    assert len(events) > 2
    assert "".join(event["text_output"] for event in events) == whole["text_output"]
    assert all("finish_reason" not in event for event in events[:-1])
    assert events[-1]["finish_reason"] == whole["finish_reason"] == "stop"
    assert events[-1]["usage"] == whole["usage"]
    assert {event["model_version"] for event in events} == {"v1"}


async def test_versioned_routes_serve_the_loaded_version_only() -> None:
    """`/versions/v1/generate` is the loaded one; an unknown version is a 404."""
    async with serve(LLM) as (client, _):
        known = await client.post("/v2/models/test/versions/v1/generate", json=request())
        unknown = await client.post("/v2/models/test/versions/v9/generate_stream", json=request())
    assert known.status_code == 200
    assert known.json()["model_version"] == "v1"
    assert unknown.status_code == 404
    assert "v9" in unknown.json()["error"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param({"parameters": {}}, 400, "text_input", id="no-text-input"),
        pytest.param(request(temperature=3), 400, "temperature", id="temperature"),
        pytest.param(request(top_p=0), 400, "top_p", id="top-p"),
        pytest.param(request(max_tokens=0), 400, "max_tokens", id="max-tokens"),
        pytest.param(request(stop=["a"] * 5), 400, "stop", id="stops"),
        pytest.param(request(beam_width=4), 400, "beam_width", id="unknown-parameter"),
        pytest.param(request(priority="urgent"), 400, "priority", id="priority"),
        pytest.param(request(timeout_ms=10**9), 403, "priority token", id="timeout-unprivileged"),
        pytest.param(
            request(" ".join(["w"] * CONTEXT)), 400, f"context of {CONTEXT}", id="over-context"
        ),
    ],
)
async def test_bad_requests_get_the_runtime_error_shape(
    body: dict[str, Any], status: int, message: str
) -> None:
    """Each refusal names its field or limit, in `{"error": str, "request_id"}`."""
    async with serve(LLM) as (client, _):
        response = await client.post(GENERATE, json=body)
        streamed = await client.post("/v2/models/test/generate_stream", json=body)
    for answer in (response, streamed):
        assert answer.status_code == status, answer.text
        assert set(answer.json()) == {"error", "request_id"}
        assert message in answer.json()["error"]


async def test_unknown_model_is_404() -> None:
    """Only the served name generates."""
    async with serve(LLM) as (client, _):
        response = await client.post("/v2/models/other/generate", json=request())
    assert response.status_code == 404
    assert "other" in response.json()["error"]


async def test_stop_parameter_cuts_the_output() -> None:
    """`parameters.stop` ends the text before the stop string."""
    async with serve(LLM) as (client, _):
        free = (await client.post(GENERATE, json=request())).json()["text_output"]
        stop = " " + free.split()[2]
        cut = (await client.post(GENERATE, json=request(stop=stop))).json()
    assert cut["text_output"] == free[: free.index(stop)]
    assert cut["finish_reason"] == "stop"


async def test_a_failure_inside_generate_stream_is_an_error_event() -> None:
    """A model step that fails mid-stream ends it with `{"error": ...}`; `generate` gets 500."""
    async with serve(f"{LLM}&error_rate=1") as (client, _):
        streamed = await client.post("/v2/models/test/generate_stream", json=request())
        whole = await client.post(GENERATE, json=request())
    events = stream_events(streamed)
    assert events[0]["text_output"]
    assert set(events[-1]) >= {"error", "request_id"}
    assert "Traceback" not in streamed.text
    assert whole.status_code == 500
    assert set(whole.json()) >= {"error", "request_id"}


async def test_model_metadata_describes_a_generative_model() -> None:
    """`GET /v2/models/{name}`: the generate extension's tensors, the context and the KV pool."""
    async with serve(LLM) as (client, _):
        response = await client.get("/v2/models/test")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["platform"] == "fleetserve-synthetic-generate"
    assert [t["name"] for t in body["inputs"]] == ["text_input"]
    assert [t["name"] for t in body["outputs"]] == ["text_output"]
    assert body["parameters"]["context_length"] == CONTEXT
    assert body["parameters"]["kv_cache"]["num_blocks"] > 0
