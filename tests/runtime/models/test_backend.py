"""The `backend` setting: ONNX Runtime runs the built-in MiniLM on the CPU in fp32 by default.

The decision is a pure function (`choose_backend`), tested branch by branch. The served
behaviour goes through the real `fleetserve-runtime serve` over loopback, with `TMPDIR`
pointing at one session-wide directory whose MiniLM graph was exported once (about 5 s).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import onnx
import pytest
import torch
from onnx import numpy_helper

from fleetserve_runtime.core.memory import MemoryProfile, resident_peak_bytes
from fleetserve_runtime.models.accuracy import (
    GUARD_TEXTS,
    AccuracyError,
    Precision,
    PrecisionOptions,
    embed_texts,
)
from fleetserve_runtime.models.minilm import MiniLMHandler
from fleetserve_runtime.models.minilm_onnx import MiniLMOnnxHandler, graph_key
from fleetserve_runtime.models.registry import Backend, choose_backend, resolve_handler
from fleetserve_runtime.serving.versions import calibration_shapes
from tests.runtime.models.cli_server import embeddings, load_failure, serving

CPU = torch.device("cpu")
MINILM = "builtin://minilm-l6"
TEXTS = [*GUARD_TEXTS[:6], "A much longer text " * 20]
MAX_LEN = 64


@pytest.mark.parametrize(
    ("uri", "backend", "device", "precision", "chosen"),
    [
        pytest.param(MINILM, "auto", "cpu", "fp32", "onnxruntime", id="minilm-auto-cpu-fp32"),
        pytest.param(MINILM, "auto", "cuda", "fp32", "torch", id="minilm-auto-cuda"),
        pytest.param(MINILM, "auto", "cpu", "int8", "torch", id="minilm-auto-int8"),
        pytest.param(MINILM, "auto", "cpu", "bf16", "torch", id="minilm-auto-bf16"),
        pytest.param(MINILM, "torch", "cpu", "fp32", "torch", id="minilm-torch"),
        pytest.param(MINILM, "onnxruntime", "cpu", "fp32", "onnxruntime", id="minilm-ort"),
        pytest.param(MINILM, "onnxruntime", "cpu", "int8", "onnxruntime", id="minilm-ort-int8"),
        pytest.param("file:///m/model.onnx", "auto", "cpu", "fp32", "onnxruntime", id="onnx"),
        pytest.param("file:///m/model.onnx", "onnxruntime", "cpu", "fp32", "onnxruntime"),
        pytest.param("builtin://synthetic", "auto", "cuda", "fp32", "torch", id="synthetic"),
        pytest.param("file:///m/model.pt?input_width=4", "torch", "cpu", "fp32", "torch"),
    ],
)
def test_choose_backend(
    uri: str, backend: Backend, device: str, precision: Precision, chosen: str
) -> None:
    """`auto` picks ONNX Runtime for MiniLM on CPU fp32 only; others follow their URI."""
    assert choose_backend(uri, backend, device=device, precision=precision) == chosen


@pytest.mark.parametrize(
    ("uri", "backend", "device", "precision", "message"),
    [
        pytest.param(
            MINILM, "onnxruntime", "cuda", "fp32", "CPU only, but the device is cuda", id="cuda"
        ),
        pytest.param(MINILM, "onnxruntime", "cpu", "bf16", "fp32 or int8, not bf16", id="bf16"),
        pytest.param(
            "builtin://synthetic",
            "onnxruntime",
            "cpu",
            "fp32",
            "backend onnxruntime does not apply to 'builtin://synthetic', which runs on torch",
            id="synthetic",
        ),
        pytest.param(
            "file:///m/model.pt?input_width=4",
            "onnxruntime",
            "cpu",
            "fp32",
            "which runs on torch; set backend to auto or torch",
            id="torchscript",
        ),
        pytest.param(
            "file:///m/model.onnx",
            "torch",
            "cpu",
            "fp32",
            "backend torch does not apply to 'file:///m/model.onnx', which runs on onnxruntime",
            id="onnx-file",
        ),
    ],
)
def test_contradicting_backends_are_refused(
    uri: str, backend: Backend, device: str, precision: Precision, message: str
) -> None:
    """A backend that cannot run the model is a clear error naming the setting."""
    with pytest.raises(ValueError, match=message):
        choose_backend(uri, backend, device=device, precision=precision)


def test_resolve_builds_the_chosen_handler() -> None:
    """The default builds the ONNX Runtime MiniLM; `torch` and int8 build the torch one."""
    default = resolve_handler(MINILM, name="m", version="1", max_sequence_length=8)
    pinned = resolve_handler(MINILM, name="m", version="1", max_sequence_length=8, backend="torch")
    on_gpu = resolve_handler(MINILM, name="m", version="1", max_sequence_length=8, device="cuda")
    assert isinstance(default, MiniLMOnnxHandler)
    assert isinstance(pinned, MiniLMHandler)
    assert isinstance(on_gpu, MiniLMHandler)


@pytest.fixture(scope="session")
def tmpdir_with_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `TMPDIR` whose MiniLM graph cache holds one exported, guarded graph."""
    tmp = tmp_path_factory.mktemp("tmpdir")
    MiniLMOnnxHandler("m", "1", cache_dir=tmp / "fleetserve-onnx-minilm").load(CPU)
    return tmp


def cached_graph(tmp: Path) -> Path:
    return tmp / "fleetserve-onnx-minilm" / graph_key() / "model.onnx"


@contextmanager
def serving_minilm(tmp: Path, log: Path, *args: str) -> Iterator[str]:
    """`fleetserve-runtime serve` of MiniLM with `TMPDIR=tmp`, its output to `log`; its URL."""
    flags = ("--max-sequence-length", str(MAX_LEN), *args)
    with serving(MINILM, "minilm", log, *flags, env={"TMPDIR": str(tmp)}) as url:
        yield url


def served(url: str) -> tuple[npt.NDArray[np.float32], dict[str, object]]:
    """Embeddings of `TEXTS` (truncated to `MAX_LEN`) and the model metadata."""
    metadata = httpx.get(f"{url}/v2/models/minilm", timeout=10).json()
    return embeddings(url, "minilm", TEXTS), metadata


def test_default_serves_minilm_on_onnxruntime_like_torch(
    tmpdir_with_graph: Path, tmp_path: Path
) -> None:
    """By default MiniLM runs on ONNX Runtime (guarded, cached graph), torch when pinned."""
    graph = cached_graph(tmpdir_with_graph)
    before = graph.stat()
    log = tmp_path / "ort.log"
    with serving_minilm(tmpdir_with_graph, log) as url:
        ort_embeddings, ort_metadata = served(url)
    with serving_minilm(tmpdir_with_graph, tmp_path / "torch.log", "--backend", "torch") as url:
        torch_embeddings, torch_metadata = served(url)
    assert ort_metadata["platform"] == "onnxruntime"
    assert torch_metadata["platform"] == "pytorch"
    parameters = ort_metadata["parameters"]
    assert isinstance(parameters, dict)
    assert parameters["precision"] == "fp32"
    assert 0.999 <= parameters["min_cosine"] <= 1.0
    # Activations in ONNX Runtime's arena are measured: at least the FFN's 1536 floats a token.
    assert parameters["bytes_per_token"] >= 1536 * 4
    assert ort_embeddings.shape == torch_embeddings.shape == (len(TEXTS), 384)
    assert (ort_embeddings * torch_embeddings).sum(axis=1).min() >= 0.999
    # The server reused the session's graph rather than exporting its own.
    after = graph.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert "exported the MiniLM graph" not in log.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ("--backend", "onnxruntime", "--precision", "bf16"),
            "backend onnxruntime serves fp32 or int8, not bf16",
            id="bf16",
        ),
        pytest.param(
            ("--backend", "onnxruntime", "--model", "builtin://synthetic"),
            "backend onnxruntime does not apply to 'builtin://synthetic'",
            id="synthetic",
        ),
    ],
)
def test_a_refused_backend_stops_the_process_with_the_reason(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    """A contradicting backend: exit EXIT_LOAD_FAILED with the reason on stderr."""
    flags = ("--device", "cpu", "--model", MINILM, "--log-format", "text", *args)
    assert message in load_failure(*flags, env={"TMPDIR": str(tmp_path)})


def test_a_corrupted_cached_graph_is_exported_again(
    tmpdir_with_graph: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cached graph ONNX Runtime cannot open is replaced by a fresh export, then served.

    The export's internals stay out of the pod's log: the only INFO lines are the runtime's.
    """
    cache = tmp_path / "graphs"
    shutil.copytree(tmpdir_with_graph / "fleetserve-onnx-minilm", cache)
    graph = cache / graph_key() / "model.onnx"
    graph.write_bytes(b"not a graph")
    handler = MiniLMOnnxHandler("m", "1", cache_dir=cache)
    with caplog.at_level(logging.INFO):
        handler.load(CPU)
    assert "exported the MiniLM graph to ONNX" in caplog.messages
    chatter = [r.name for r in caplog.records if not r.name.startswith("fleetserve")]
    assert not chatter, f"the export logged through {sorted(set(chatter))}"
    assert handler.graph_dir == graph.parent
    assert graph.stat().st_size > 1_000_000
    assert handler.metadata.min_cosine is not None
    assert handler.metadata.min_cosine >= 0.999


def test_a_cached_graph_failing_the_guard_is_exported_again(
    tmpdir_with_graph: Path, tmp_path: Path
) -> None:
    """A cached graph that loads but embeds wrongly fails the guard and is replaced."""
    cache = tmp_path / "graphs"
    shutil.copytree(tmpdir_with_graph / "fleetserve-onnx-minilm", cache)
    graph = cache / graph_key() / "model.onnx"
    model = onnx.load(str(graph))
    rng = np.random.default_rng(0)
    for tensor in model.graph.initializer:
        values = numpy_helper.to_array(tensor)
        if values.dtype == np.float32 and values.ndim == 2 and values.shape[0] < 1000:
            noise = rng.standard_normal(values.shape).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(noise, tensor.name))
    onnx.save(model, str(graph))
    wrong = graph.read_bytes()
    handler = MiniLMOnnxHandler("m", "1", cache_dir=cache)
    handler.load(CPU)
    assert graph.read_bytes() != wrong
    assert handler.metadata.min_cosine is not None
    assert handler.metadata.min_cosine >= 0.999


def test_a_graph_under_the_guard_floor_is_refused(tmpdir_with_graph: Path, tmp_path: Path) -> None:
    """A floor over the graph's figure refuses the load, even after a fresh export."""
    cache = tmp_path / "graphs"
    shutil.copytree(tmpdir_with_graph / "fleetserve-onnx-minilm", cache)
    strict = MiniLMOnnxHandler(
        "m", "1", cache_dir=cache, precision=PrecisionOptions(min_cosine=1.0)
    )
    with pytest.raises(AccuracyError, match=r"graph of MiniLM in .* strays from torch"):
        strict.load(CPU)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_a_graph_cache_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """A cache directory someone else owns could hold a planted graph: refused, not read."""
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, 65534, 65534)
    with pytest.raises(ValueError, match="MiniLM graph cache .* belongs to another user"):
        MiniLMOnnxHandler("m", "1", cache_dir=cache).load(CPU)


def test_resident_peak_bytes_sees_memory_torch_does_not() -> None:
    """Memory a batch touches outside torch shows as resident growth; nothing adds little."""
    size = 64 << 20
    touched = resident_peak_bytes(lambda: np.ones(size, dtype=np.uint8).sum())
    idle = resident_peak_bytes(lambda: None)
    assert touched >= size
    assert idle < size // 8


def test_onnxruntime_batches_are_measured_growing_with_shape(tmpdir_with_graph: Path) -> None:
    """A real ORT session's batch peaks grow with shape; the fit's per-token cost is positive.

    Each peak is at least the batch's `[batch, sequence, 384]` fp32 hidden state, which ONNX
    Runtime must hold: the measurement does not under-count the arena.
    """
    handler = MiniLMOnnxHandler("m", "1", cache_dir=tmpdir_with_graph / "fleetserve-onnx-minilm")
    handler.load(CPU)
    samples = []
    for size, length in [(1, 16), (4, 64), (8, 128), (16, 254)]:
        texts = ["word " * length] * size
        peak = handler.batch_peak_bytes(partial(embed_texts, handler, texts, CPU))
        tokens = size * handler.preprocess(texts[0], truncate=True).length
        assert peak >= tokens * 384 * 4
        samples.append((tokens, peak))
    peaks = [peak for _, peak in samples]
    assert peaks == sorted(peaks)
    assert MemoryProfile.fit(handler.weights_bytes(), samples).bytes_per_token > 0


@pytest.mark.parametrize("max_len", [8, 64, 128, 256, 512])
def test_calibration_measures_the_smallest_batch_first(max_len: int) -> None:
    """Shapes come in increasing padded tokens, so no batch hides in a larger one's pages."""
    tokens = [size * length for size, length in calibration_shapes(max_len)]
    assert tokens == sorted(tokens)
