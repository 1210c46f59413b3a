"""`POST /tokenize` and `POST /detokenize` (vLLM's shapes) over the real server.

The synthetic model checks the mechanics: a chat's count is the `prompt_tokens` its chat
completion reports, errors are OpenAI's shape (404 unknown model, 400 naming the key).
SmolLM2 checks a real tokenizer's round trip.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.runtime.server.test_openai_client import CONTEXT, LLM, MESSAGES, client, running


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running(LLM) as url:
        yield url


def post(url: str, path: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": "test", **body}, timeout=20)


def test_a_chat_count_is_its_prompt_tokens(server: str) -> None:
    """`/tokenize` of messages counts what the chat completion bills as its prompt."""
    tokenized = post(server, "/tokenize", messages=MESSAGES, add_generation_prompt=True)
    assert tokenized.status_code == 200
    body = tokenized.json()
    assert set(body) == {"count", "max_model_len", "tokens"}
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] == CONTEXT
    with client(server) as api:
        answer = api.chat.completions.create(model="test", messages=MESSAGES, max_tokens=2)
    assert answer.usage is not None
    assert body["count"] == answer.usage.prompt_tokens


def test_a_prompt_round_trips(server: str) -> None:
    """Text to ids as a completion's prompt (BOS, then one id per word), and ids to text."""
    tokens = post(server, "/tokenize", prompt="the river runs").json()["tokens"]
    assert len(tokens) == 4
    assert tokens[0] == 1
    assert post(server, "/detokenize", tokens=[20, 21]).json() == {"prompt": "in wind"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        pytest.param("/tokenize", {"model": "other", "prompt": "x"}, 404, None, id="model"),
        pytest.param("/detokenize", {"model": "other", "tokens": [2]}, 404, None, id="model-de"),
        pytest.param("/tokenize", {"prompt": "x", "truncate": 1}, 400, "truncate", id="key"),
        pytest.param("/tokenize", {"prompt": ""}, 400, "prompt", id="empty-prompt"),
        pytest.param("/tokenize", {"prompt": "w " * 4000}, 400, "prompt", id="too-long"),
        pytest.param(
            "/tokenize",
            {"messages": MESSAGES, "add_generation_prompt": False},
            400,
            "add_generation_prompt",
            id="no-generation-prompt",
        ),
        pytest.param("/detokenize", {"tokens": [10**9]}, 400, "tokens", id="past-vocab"),
        pytest.param("/detokenize", {"tokens": [-1]}, 400, "tokens.0", id="negative"),
        pytest.param("/detokenize", {"tokens": "abc"}, 400, "tokens", id="not-a-list"),
    ],
)
def test_bad_requests_are_openai_errors(
    server: str, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    """Errors in OpenAI's shape, naming the field."""
    response = httpx.post(f"{server}{path}", json={"model": "test", **body}, timeout=20)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_errors_before_the_route_are_openai_errors_too(server: str, path: str) -> None:
    """A wrong method is answered in OpenAI's shape, as on the other OpenAI routes."""
    response = httpx.get(f"{server}{path}", timeout=20)
    assert response.status_code == 405
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_smollm2_tokenize_detokenize_round_trip() -> None:
    """SmolLM2's tokenizer: text to ids and back, and a chat count its completion agrees with."""
    text = "Fleetserve counts tokens: naïve café, 東京, 🙂 and spaces  too."
    with running(
        "builtin://smollm2-135m",
        *("--generation-max-context", "512", "--threads", "2"),
        ready_s=180,
    ) as url:
        tokenized = post(url, "/tokenize", prompt=text).json()
        back = post(url, "/detokenize", tokens=tokenized["tokens"]).json()
        chat = post(url, "/tokenize", messages=MESSAGES).json()
        with client(url) as api:
            answer = api.chat.completions.create(model="test", messages=MESSAGES, max_tokens=1)
    assert tokenized["count"] == len(tokenized["tokens"]) > 10
    assert tokenized["max_model_len"] == 512
    assert back == {"prompt": text}
    assert answer.usage is not None
    assert chat["count"] == answer.usage.prompt_tokens
