"""What the OpenAI route tests share.

The synthetic LLMs they serve, a chat body, SSE payloads and the OpenAI error shape.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

CONTEXT = 64
LLM = f"builtin://synthetic-generate?per_token_ms=0&output_tokens=12&context_length={CONTEXT}"
SLOW_LLM = f"builtin://synthetic-generate?per_token_ms=40&output_tokens=40&context_length={CONTEXT}"
CHAT = "/v1/chat/completions"
TOKEN = "openai-route-token-0123456789"


def chat(content: str = "tell me about rivers", **fields: Any) -> dict[str, Any]:
    return {"model": "test", "messages": [{"role": "user", "content": content}], **fields}


def events(response: httpx.Response) -> list[Any]:
    """The SSE `data:` payloads of a stream, JSON-decoded (`[DONE]` kept as the string)."""
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.endswith("\n\n")
    payloads: list[Any] = []
    for block in response.text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    """An OpenAI-shaped error with `status` naming `param`; returns its `error` object."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "request_id"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["message"]
    return dict(error)
