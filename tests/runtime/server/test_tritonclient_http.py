"""NVIDIA's `tritonclient.http`, with its defaults, against the real server over loopback.

Its defaults send inputs and ask for outputs in the binary tensor data extension; the
answers must equal the JSON path's, for the synthetic model and for MiniLM's real
embeddings. Hand-built hostile bodies (lengths that lie) get a 400 with the JSON error body
and never reach the model.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import orjson
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from bench.server_proc import running_server, runtime_serve_argv
from fleetserve_runtime.testing import metric_total
from fleetserve_runtime.testing.process import free_port

CLI = str(Path(sys.executable).with_name("fleetserve-runtime"))
TEXTS = ["the river runs to the sea", "a quiet library", "héllo wörld ✓"]


@contextmanager
def serve(model: str, tmp: Path, *flags: str) -> Iterator[str]:
    """`fleetserve-runtime serve` of `model` as "test" on a free loopback port; its address."""
    port = free_port()
    argv = runtime_serve_argv([CLI], model=model, name="test", port=port)
    with running_server(
        [*argv, "--no-warmup", *flags],
        base_url=f"http://127.0.0.1:{port}",
        core=0,
        log_path=tmp / "server.log",
    ):
        yield f"127.0.0.1:{port}"


SOURCE = ("s3://models/synthetic/v1", "sha256:" + "5e" * 32, {"commit": "3f2a9c1"})
"""Where the synthetic server says its model came from: URI, digest and facts."""


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = "builtin://synthetic?latency_ms=0&per_item_ms=0&dim=16"
    uri, digest, facts = SOURCE
    flags = (
        "--max-body-bytes=65536",
        *("--model-source", uri, "--model-digest", digest),
        *("--model-metadata", ",".join(f"{key}={value}" for key, value in facts.items())),
    )
    with serve(model, tmp_path_factory.mktemp("synthetic"), *flags) as address:
        yield address


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve("builtin://minilm-l6", tmp_path_factory.mktemp("minilm")) as address:
        yield address


def text_input(texts: list[str]) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    return tensor


def json_embeddings(address: str, texts: list[str], path: str) -> npt.NDArray[np.float32]:
    """The same request through the JSON path, as a float32 array of the answered shape."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    response = httpx.post(f"http://{address}{path}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def batches(address: str) -> float:
    """Batches the server computed so far."""
    text = httpx.get(f"http://{address}/metrics").text
    return metric_total(text, "fleetserve_batch_size_count")


@pytest.mark.parametrize("version", ["", "v1"], ids=["infer", "versioned-infer"])
def test_client_defaults_are_binary_and_equal_json(synthetic: str, version: str) -> None:
    """Binary input in, binary output back (both routes); the values are the JSON path's."""
    client = triton.InferenceServerClient(synthetic)
    result = client.infer("test", [text_input(TEXTS)], model_version=version)
    output = result.get_output("embedding")
    assert output is not None
    assert "binary_data_size" in output["parameters"]
    assert "data" not in output
    embeddings = result.as_numpy("embedding")
    path = f"/v2/models/test/versions/{version}/infer" if version else "/v2/models/test/infer"
    expected = json_embeddings(synthetic, TEXTS, path)
    assert embeddings.dtype == np.float32
    assert embeddings.shape == (len(TEXTS), 16)
    np.testing.assert_array_equal(embeddings, expected)


@pytest.mark.parametrize("version", ["", "v1"], ids=["model", "version"])
def test_model_metadata_reads_with_the_source_in_it(synthetic: str, version: str) -> None:
    """The client reads the metadata as ever; `parameters.source` rides along inside it."""
    client = triton.InferenceServerClient(synthetic)
    metadata = client.get_model_metadata("test", model_version=version)
    assert (metadata["name"], metadata["versions"]) == ("test", ["v1"])
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["text"]
    uri, digest, facts = SOURCE
    expected = {"uri": uri, "digest": digest, "metadata": facts}
    assert metadata["parameters"]["source"] == expected
    assert client.is_model_ready("test", model_version=version)


def test_an_output_asked_for_as_json_comes_back_as_json(synthetic: str) -> None:
    """`binary_data=False` on the requested output: JSON data, though the input was binary."""
    client = triton.InferenceServerClient(synthetic)
    wanted = triton.InferRequestedOutput("embedding", binary_data=False)
    result = client.infer("test", [text_input(TEXTS)], outputs=[wanted])
    output = result.get_output("embedding")
    assert output is not None
    assert len(output["data"]) == len(TEXTS) * 16
    np.testing.assert_array_equal(
        result.as_numpy("embedding"), json_embeddings(synthetic, TEXTS, "/v2/models/test/infer")
    )


@pytest.mark.parametrize("version", ["", "v1"], ids=["infer", "versioned-infer"])
def test_json_mode_is_served_like_the_binary_one(synthetic: str, version: str) -> None:
    """The client's JSON mode (`binary_data=False` on input and output) is served.

    It sends the body without a `Content-Type`, as Triton takes it, and gets JSON data back,
    equal to the binary answer.
    """
    client = triton.InferenceServerClient(synthetic)
    tensor = triton.InferInput("text", [len(TEXTS)], "BYTES")
    texts = np.array([t.encode() for t in TEXTS], dtype=np.object_)
    tensor.set_data_from_numpy(texts, binary_data=False)
    wanted = triton.InferRequestedOutput("embedding", binary_data=False)
    result = client.infer("test", [tensor], outputs=[wanted], model_version=version)
    output = result.get_output("embedding")
    assert output is not None
    assert len(output["data"]) == len(TEXTS) * 16
    binary = client.infer("test", [text_input(TEXTS)], model_version=version)
    np.testing.assert_array_equal(result.as_numpy("embedding"), binary.as_numpy("embedding"))


def test_minilm_embeddings_equal_the_json_path(minilm: str) -> None:
    """MiniLM's real 384-float embeddings, bit for bit, either way."""
    client = triton.InferenceServerClient(minilm, network_timeout=60)
    embeddings = client.infer("test", [text_input(TEXTS)]).as_numpy("embedding")
    assert embeddings.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(
        embeddings, json_embeddings(minilm, TEXTS, "/v2/models/test/infer")
    )


def length_prefixed(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def binary_request(size: int, shape: list[int], datatype: str = "BYTES") -> bytes:
    header = {
        "inputs": [
            {
                "name": "text",
                "datatype": datatype,
                "shape": shape,
                "parameters": {"binary_data_size": size},
            }
        ]
    }
    return orjson.dumps(header)


TWO = length_prefixed(b"one text", b"another")


@pytest.mark.parametrize(
    ("header_length", "header", "tail", "says"),
    [
        pytest.param(+100, binary_request(len(TWO), [2]), TWO, "has only",
                     id="header-longer-than-body"),
        pytest.param("-1", binary_request(len(TWO), [2]), TWO, "digits only",
                     id="negative-header-length"),
        pytest.param(-3, binary_request(len(TWO), [2]), TWO, "not valid JSON",
                     id="header-cut-short"),
        pytest.param(0, binary_request(len(TWO) + 8, [2]), TWO, "binary_data_size",
                     id="size-past-the-end"),
        pytest.param(0, binary_request(8, [2], "FP32"), b"\0" * 12, "accounts for",
                     id="bytes-left-over"),
        pytest.param(0, binary_request(len(TWO) - 4, [2]), TWO, "past the end",
                     id="size-cuts-an-element"),
        pytest.param(0, binary_request(-1, [2]), TWO, "binary_data_size", id="negative-size"),
        pytest.param(0, binary_request(12, [1]), struct.pack("<I", 1_000_000) + b"12345678",
                     "past the end", id="bytes-length-prefix-past-end"),
        pytest.param(0, binary_request(len(TWO), [3]), TWO, "shape needs 3",
                     id="shape-size-mismatch"),
        pytest.param(0, binary_request(6, [2], "FP32"), b"\0" * 6, "8 bytes",
                     id="fp32-size-mismatch"),
        pytest.param(0, binary_request(8, [2], "FP32"), b"\0" * 8, "datatype BYTES",
                     id="datatype-mismatch"),
    ],
)  # fmt: skip
def test_hostile_bodies_get_400_json(
    synthetic: str, header_length: int | str, header: bytes, tail: bytes, says: str
) -> None:
    """Lengths that disagree with the body are refused by name, before the model.

    `header_length` is the header's true length shifted by an int, or a literal string.
    """
    declared = header_length if isinstance(header_length, str) else len(header) + header_length
    before = batches(synthetic)
    response = httpx.post(
        f"http://{synthetic}/v2/models/test/infer",
        content=header + tail,
        headers={
            "inference-header-content-length": str(declared),
            "content-type": "application/octet-stream",
        },
    )
    assert response.status_code == 400, response.text
    error = response.json()
    assert set(error) >= {"error", "request_id"}
    assert says in error["error"]
    assert batches(synthetic) == before


def test_binary_body_over_the_limit_is_413(synthetic: str) -> None:
    """`max_body_bytes` bounds binary bodies as it bounds JSON ones."""
    big = length_prefixed(b"x" * 70_000)
    body = binary_request(len(big), [1])
    response = httpx.post(
        f"http://{synthetic}/v2/models/test/infer",
        content=body + big,
        headers={"inference-header-content-length": str(len(body))},
    )
    assert response.status_code == 413
    assert "limit" in response.json()["error"]


@pytest.mark.parametrize(
    "media", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain"]
)
def test_json_infer_still_needs_json_media_type_without_the_header(
    synthetic: str, media: str
) -> None:
    """What a browser may post cross-site without a preflight is 415, even with a JSON body.

    Only the extension's header lifts the rule, and a missing type counts as JSON.
    """
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    response = httpx.post(
        f"http://{synthetic}/v2/models/test/infer",
        content=orjson.dumps(body),
        headers={"content-type": media},
    )
    assert response.status_code == 415
    assert "application/json" in response.json()["error"]


def test_binary_requests_need_the_token_like_json_ones(tmp_path: Path) -> None:
    """With `auth_token_file`, a binary request without the token is a 401; with it, served."""
    token = "binary-extension-token-0123456789"
    (tmp_path / "token").write_text(token)
    model = "builtin://synthetic?latency_ms=0&per_item_ms=0&dim=4"
    with serve(model, tmp_path, f"--auth-token-file={tmp_path / 'token'}") as address:
        client = triton.InferenceServerClient(address)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("test", [text_input(TEXTS)])
        assert refused.value.status() == "401"
        assert "bearer token" in str(refused.value.message())
        served = client.infer(
            "test", [text_input(TEXTS)], headers={"authorization": f"Bearer {token}"}
        )
        assert served.as_numpy("embedding").shape == (len(TEXTS), 4)
