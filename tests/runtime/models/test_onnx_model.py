"""ONNX text encoders served by ONNX Runtime, through the real `fleetserve-runtime serve`.

MiniLM is exported once per session (`models.onnx_export`, about 10 s here) into a temp
directory with its tokenizer, the layout a user brings; the served embeddings are compared
with the torch MiniLM handler's.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import onnx
import pytest
import torch

from fleetserve_runtime.models.accuracy import (
    GUARD_TEXTS,
    AccuracyError,
    PrecisionOptions,
    embed_texts,
)
from fleetserve_runtime.models.minilm import MiniLMHandler
from fleetserve_runtime.models.onnx_export import export_minilm
from fleetserve_runtime.models.onnx_model import OnnxEncoderHandler, quantized_path
from tests.runtime.models.cli_server import embeddings, load_failure, serving

CPU = torch.device("cpu")
TEXTS = [*GUARD_TEXTS[:5], "A much longer text " * 20]
MAX_LEN = 64


@pytest.fixture(scope="session")
def onnx_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`model.onnx` + `tokenizer.json` of MiniLM, exported once for the session."""
    return export_minilm(tmp_path_factory.mktemp("onnx-minilm"))


@pytest.fixture(scope="module")
def torch_embeddings() -> npt.NDArray[np.float32]:
    """The torch MiniLM's embeddings of `TEXTS`, truncated as the servers below truncate."""
    handler = MiniLMHandler("m", "1", max_sequence_length=MAX_LEN)
    handler.load(CPU)
    return embed_texts(handler, TEXTS, CPU)


def test_onnx_model_serves_embeddings_like_torch(
    onnx_model: Path, torch_embeddings: npt.NDArray[np.float32], tmp_path: Path
) -> None:
    """Over loopback, the ONNX graph's pooled embeddings match the torch path (cos ≥ 0.999)."""
    args = ("--max-sequence-length", str(MAX_LEN))
    with serving(f"file://{onnx_model}", "onnx", tmp_path / "log", *args) as url:
        served = embeddings(url, "onnx", TEXTS)
        metadata = httpx.get(f"{url}/v2/models/onnx", timeout=10).json()
    cosines = (served * torch_embeddings).sum(axis=1)
    assert served.shape == (len(TEXTS), 384)
    assert cosines.min() >= 0.999
    assert np.allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)
    assert metadata["platform"] == "onnxruntime"
    # ONNX Runtime's arena is invisible to torch: the file size is what counts as weights.
    assert metadata["parameters"]["weights_bytes"] >= onnx_model.stat().st_size


def test_int8_onnx_model_is_quantised_guarded_and_cached(
    onnx_model: Path, torch_embeddings: npt.NDArray[np.float32], tmp_path: Path
) -> None:
    """`--precision int8` quantises at load into the temp dir, passes the guard, serves."""
    env = {"TMPDIR": str(tmp_path)}
    args = ("--precision", "int8", "--no-warmup", "--max-sequence-length", str(MAX_LEN))
    with serving(f"file://{onnx_model}", "onnx", tmp_path / "log", *args, env=env) as url:
        served = embeddings(url, "onnx", TEXTS[:5])
    cached = list((tmp_path / "fleetserve-onnx-int8").glob("*.int8.onnx"))
    assert len(cached) == 1
    assert cached[0].stat().st_size < onnx_model.stat().st_size * 0.8
    cosines = (served * torch_embeddings[:5]).sum(axis=1)
    assert 0.99 <= cosines.min() < 0.99999


def test_int8_onnx_under_the_floor_is_refused(onnx_model: Path, tmp_path: Path) -> None:
    """The guard applies to ONNX int8 too: an unreachable floor refuses with the figure."""
    handler = OnnxEncoderHandler(
        "m", "1", path=onnx_model, precision=PrecisionOptions("int8", 1.0), cache_dir=tmp_path
    )
    with pytest.raises(AccuracyError, match=r"min cosine 0\.99\d+ to fp32, on guard text \d+"):
        handler.load(CPU)


def test_a_missing_onnx_model_stops_the_process_with_the_reason(tmp_path: Path) -> None:
    """A model path that does not exist: exit EXIT_LOAD_FAILED, the path named on stderr."""
    missing = tmp_path / "nope" / "model.onnx"
    assert f"ONNX model {missing} does not exist" in load_failure("--model", f"file://{missing}")


def test_a_corrupt_graph_or_no_tokenizer_is_a_clear_load_error(
    onnx_model: Path, tmp_path: Path
) -> None:
    """Garbage bytes, or a graph without tokenizer.json beside it, name the problem."""
    lonely = tmp_path / "lonely" / "model.onnx"
    lonely.parent.mkdir()
    lonely.write_bytes(onnx_model.read_bytes())
    with pytest.raises(ValueError, match=r"needs tokenizer\.json beside it"):
        OnnxEncoderHandler("m", "1", path=lonely).load(CPU)
    (lonely.parent / "tokenizer.json").write_bytes(
        (onnx_model.parent / "tokenizer.json").read_bytes()
    )
    lonely.write_bytes(b"not a graph")
    with pytest.raises(ValueError, match="ONNX Runtime cannot load"):
        OnnxEncoderHandler("m", "1", path=lonely).load(CPU)


def test_bf16_is_refused_for_onnx_models(onnx_model: Path) -> None:
    """ONNX models are served in fp32 or int8 only."""
    with pytest.raises(ValueError, match="bf16 is not available for ONNX models"):
        OnnxEncoderHandler("m", "1", path=onnx_model, precision=PrecisionOptions("bf16"))


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_an_int8_cache_owned_by_another_user_is_refused(onnx_model: Path, tmp_path: Path) -> None:
    """A cache directory someone else owns could hold a planted graph: refused, not read."""
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, 65534, 65534)
    with pytest.raises(ValueError, match="belongs to another user; set TMPDIR"):
        quantized_path(onnx_model, cache)


def test_a_pooled_output_with_token_types_is_used_as_is(onnx_model: Path, tmp_path: Path) -> None:
    """A graph with a [batch, hidden] output is not pooled again, only normalised.

    The graph returns its token ids plus its token types, as floats: one "embedding" value per
    position, so the result shows which output was read and that token types are zeros.
    """
    ids = onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["b", "s"])
    types = onnx.helper.make_tensor_value_info("token_type_ids", onnx.TensorProto.INT64, ["b", "s"])
    pooled = onnx.helper.make_tensor_value_info("pooled", onnx.TensorProto.FLOAT, ["b", "s"])
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Add", ["input_ids", "token_type_ids"], ["sum"]),
            onnx.helper.make_node("Cast", ["sum"], ["pooled"], to=onnx.TensorProto.FLOAT),
        ],
        "ids",
        [ids, types],
        [pooled],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    (tmp_path / "tokenizer.json").write_bytes((onnx_model.parent / "tokenizer.json").read_bytes())
    handler = OnnxEncoderHandler("m", "1", path=path)
    handler.load(CPU)
    item = handler.preprocess("hello world", truncate=False)
    embedding = embed_texts(handler, ["hello world"], CPU)[0]
    expected = np.asarray(item.data, dtype=np.float32)
    np.testing.assert_allclose(embedding, expected / np.linalg.norm(expected), rtol=1e-6)
