"""`POST /v1/embeddings` against the real server process serving MiniLM, over loopback.

The vectors are the OIP infer route's for the same texts (one serving path), in floats or
base64; a key, `dimensions` or token ids it does not implement are 400s naming the field,
an unknown model 404, more texts than `max_instances` the infer route's 413, a text over
the model's length OpenAI's `context_length_exceeded`, all in OpenAI's error shape; the
scheduling headers and the request metrics apply as on the infer route. The official
`openai` client (which asks for base64 by default) gets 384-dimensional vectors whose
cosine tells paraphrases apart. A generative model is refused in process.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest

from bench.server_proc import running_server, runtime_serve_argv
from fleetserve_runtime.testing import infer_request, metric_total
from fleetserve_runtime.testing.asgi import serve
from fleetserve_runtime.testing.process import free_port

CLI = str(Path(sys.executable).with_name("fleetserve-runtime"))
MAX_INSTANCES = 4
DIMENSION = 384
TEXTS = ["the river runs to the sea", "a quiet library", "héllo wörld ✓"]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """MiniLM served as "minilm", at most `MAX_INSTANCES` texts a request; its base URL."""
    port = free_port()
    argv = runtime_serve_argv([CLI], model="builtin://minilm-l6", name="minilm", port=port)
    url = f"http://127.0.0.1:{port}"
    with running_server(
        [*argv, "--no-warmup", f"--max-instances={MAX_INSTANCES}"],
        base_url=url,
        core=0,
        log_path=tmp_path_factory.mktemp("minilm") / "server.log",
    ):
        yield url


def embed(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/embeddings", json=body, headers=headers, timeout=30)


def vectors(response: httpx.Response) -> npt.NDArray[np.float32]:
    """The answered float vectors, in `index` order, after checking the envelope."""
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == "minilm"
    assert [item["object"] for item in body["data"]] == ["embedding"] * len(body["data"])
    assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
    return np.array([item["embedding"] for item in body["data"]], dtype=np.float32)


def oip(url: str, texts: list[str]) -> npt.NDArray[np.float32]:
    response = httpx.post(f"{url}/v2/models/minilm/infer", json=infer_request(texts), timeout=30)
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def assert_refused(response: httpx.Response, status: int, param: str | None, text: str) -> None:
    """An OpenAI-shaped error with `status`, naming `param`, its message holding `text`."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert text in error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def test_vectors_equal_the_oip_route(minilm: str) -> None:
    """A list of texts gets the infer route's vectors, in order, one per text."""
    got = vectors(embed(minilm, {"model": "minilm", "input": TEXTS}))
    assert got.shape == (len(TEXTS), DIMENSION)
    np.testing.assert_allclose(got, oip(minilm, TEXTS), rtol=1e-6, atol=1e-6)


def test_a_single_string_is_one_vector(minilm: str) -> None:
    """`input` as one string answers one vector, the infer route's for that text."""
    got = vectors(embed(minilm, {"model": "minilm", "input": TEXTS[1], "user": "u-1"}))
    assert got.shape == (1, DIMENSION)
    np.testing.assert_allclose(got, oip(minilm, [TEXTS[1]]), rtol=1e-6, atol=1e-6)


def test_usage_counts_the_tokenizers_tokens(minilm: str) -> None:
    """[CLS] + one token per word + [SEP]; the counts of several texts add up."""
    one = embed(minilm, {"model": "minilm", "input": "hello world"}).json()["usage"]
    two = embed(minilm, {"model": "minilm", "input": ["hello world", "a b c"]}).json()["usage"]
    assert one == {"prompt_tokens": 4, "total_tokens": 4}
    assert two == {"prompt_tokens": 9, "total_tokens": 9}


def test_base64_decodes_to_the_float_vectors(minilm: str) -> None:
    """`encoding_format: base64` is each vector's little-endian float32 bytes."""
    floats = vectors(embed(minilm, {"model": "minilm", "input": TEXTS}))
    response = embed(minilm, {"model": "minilm", "input": TEXTS, "encoding_format": "base64"})
    assert response.status_code == 200, response.text
    decoded = np.array(
        [
            np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
            for item in response.json()["data"]
        ]
    )
    assert decoded.shape == (len(TEXTS), DIMENSION)
    np.testing.assert_array_equal(decoded, floats)


def test_an_unknown_key_is_refused_by_name(minilm: str) -> None:
    """A key the route does not implement is a 400 naming it, never ignored."""
    response = embed(minilm, {"model": "minilm", "input": "a", "truncate_prompt_tokens": 8})
    assert_refused(response, 400, "truncate_prompt_tokens", "'truncate_prompt_tokens'")


def test_dimensions_other_than_the_models_are_refused(minilm: str) -> None:
    """Vectors are never shortened: only the model's own `dimensions` is taken."""
    refused = embed(minilm, {"model": "minilm", "input": "a", "dimensions": 128})
    assert_refused(refused, 400, "dimensions", "384")
    taken = embed(minilm, {"model": "minilm", "input": "a", "dimensions": DIMENSION})
    assert vectors(taken).shape == (1, DIMENSION)


def test_token_ids_and_an_empty_input_are_refused(minilm: str) -> None:
    """The encoders take text: token ids (flat or nested) and no text at all name `input`."""
    for given in ([101, 7592, 102], [[101, 7592, 102]], []):
        response = embed(minilm, {"model": "minilm", "input": given})
        assert_refused(response, 400, "input", "input")


def test_a_text_over_the_models_length_is_openais_context_error(minilm: str) -> None:
    """Not truncated: a 400 `context_length_exceeded` naming `input`, as OpenAI answers it."""
    response = embed(minilm, {"model": "minilm", "input": ["short", "word " * 300]})
    assert_refused(response, 400, "input", "max_sequence_length")
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_an_unknown_model_is_not_found(minilm: str) -> None:
    response = embed(minilm, {"model": "gpt-embed", "input": "a"})
    assert_refused(response, 404, None, "'gpt-embed'")


def test_more_texts_than_max_instances_are_the_infer_routes_refusal(minilm: str) -> None:
    """`max_instances` bounds both routes alike: one text over is a 413 naming the limit."""
    texts = ["some text"] * (MAX_INSTANCES + 1)
    refused = embed(minilm, {"model": "minilm", "input": texts})
    assert_refused(refused, 413, None, f"the limit is {MAX_INSTANCES}")
    oip_refused = httpx.post(f"{minilm}/v2/models/minilm/infer", json=infer_request(texts))
    assert oip_refused.status_code == 413
    assert vectors(embed(minilm, {"model": "minilm", "input": texts[1:]})).shape[0] == MAX_INSTANCES


def test_errors_before_the_route_take_openais_shape(minilm: str) -> None:
    """A wrong method is answered by the framework, a body not JSON by the route: both OpenAI's."""
    wrong_method = httpx.get(f"{minilm}/v1/embeddings", timeout=30)
    assert_refused(wrong_method, 405, None, "Method Not Allowed")
    not_json = httpx.post(f"{minilm}/v1/embeddings", content=b"input=a", timeout=30)
    assert_refused(not_json, 415, None, "application/json")


def test_the_serving_path_schedules_and_counts(minilm: str) -> None:
    """The infer route's admission: `high` needs the priority token; answers are counted."""
    page = httpx.get(f"{minilm}/metrics").text
    before = metric_total(page, "fleetserve_requests_total", code="403")
    response = embed(minilm, {"model": "minilm", "input": "a"}, **{"x-fleetserve-priority": "high"})
    assert response.status_code == 403, response.text
    assert response.json()["error"]["type"] == "permission_error"
    page = httpx.get(f"{minilm}/metrics").text
    assert metric_total(page, "fleetserve_requests_total", code="403") == before + 1


def test_the_openai_client_gets_vectors_that_tell_paraphrases_apart(minilm: str) -> None:
    """`embeddings.create` unchanged (base64 on the wire): 384 floats; paraphrases are close."""
    texts = [
        "The cat sat on the mat.",
        "A cat was sitting on the rug.",
        "Quarterly revenue rose by eight percent.",
    ]
    with openai.OpenAI(base_url=f"{minilm}/v1", api_key="unused", max_retries=0) as api:
        answer = api.embeddings.create(model="minilm", input=texts)
    rows = np.array([item.embedding for item in answer.data], dtype=np.float32)
    assert rows.shape == (len(texts), DIMENSION)
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    cosine = unit @ unit.T
    assert cosine[0, 1] > 0.5
    assert cosine[0, 1] > cosine[0, 2] + 0.3
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(texts) * 2
    np.testing.assert_allclose(rows, oip(minilm, texts), rtol=1e-6, atol=1e-6)


async def test_a_generative_model_has_no_embeddings() -> None:
    """A model that generates text is a 400 naming `model` and the routes it serves."""
    model = "builtin://synthetic-generate?per_token_ms=0&output_tokens=4&context_length=64"
    async with serve(model) as (client, _):
        response = await client.post("/v1/embeddings", json={"model": "test", "input": "a"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "model"
    assert "generates text" in error["message"]
    assert "/v1/chat/completions" in error["message"]
