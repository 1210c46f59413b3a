"""A text encoder in ONNX, run by ONNX Runtime: `file:///models/<dir>/model.onnx`.

Directory layout (what a user brings):

    <dir>/model.onnx        the graph (weights inline, or beside it as external data files)
    <dir>/tokenizer.json    the model's Hugging Face `tokenizers` file

The graph takes `input_ids` and, when it declares them, `attention_mask` and `token_type_ids`
(int64 `[batch, sequence]`; token types are all zero, one segment). Its output is either a
last hidden state `[batch, sequence, hidden]`, mean-pooled over real tokens here, or an
already pooled `[batch, hidden]` embedding: the first rank-2 output wins, else the first
rank-3 one. Either way the embedding is L2-normalised, as MiniLM-style sentence encoders are.

The session runs with every graph optimisation (`ORT_ENABLE_ALL`) and as many intra-op
threads as torch was given (`threads`). Batches are always padded rectangles (ONNX graphs
take no packed layout), to the bucket edge the batcher chose.

Memory: ONNX Runtime allocates from its own arena, which the runtime's torch-based memory
measurement does not see, so the weights are declared as the bytes of the model file(s)
loaded (`weights_bytes`), and the handler measures its batches' activations itself
(`batch_peak_bytes`, the executor's calibration prefers it): the growth of the process's
resident memory across the batch (`core.memory.resident_peak_bytes`). To make that growth the
batch's own need, every session allocates from one process-wide CPU arena that extends by
exactly what is requested (`kSameAsRequested`, not the next power of two), and a measured
batch runs with arena shrinkage, so it starts and ends with the arena at its initial size
(a one-token batch shrinks it before the first). The figure is an upper bound: anything
else the process touches meanwhile counts too.

`precision: int8` rewrites the graph's MatMuls at load into ONNX Runtime's `MatMulNBits`
with 8-bit weights in blocks of 32 and `accuracy_level` 4, which quantises activations to
int8 block by block too, so one outlier channel costs only its own block's resolution
(Gather, i.e. embeddings, normalisation and pooling stay fp32). ONNX Runtime's
`quantize_dynamic` was measured and rejected: one activation scale per tensor left MiniLM at
a minimum cosine of 0.964 on the guard texts, under the 0.99 floor, where `MatMulNBits`
reaches 0.998. The result is cached in `$TMPDIR/fleetserve-onnx-int8/` (a directory only
its owner may use) keyed by the graph's digest, and the accuracy guard (`models.accuracy`)
runs against the fp32 graph.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort  # type: ignore[import-untyped]
import torch
from tokenizers import Tokenizer

from fleetserve_runtime.core.memory import resident_peak_bytes
from fleetserve_runtime.models.accuracy import GUARD_TEXTS, PrecisionOptions, check, embed_texts
from fleetserve_runtime.models.base import (
    CollateContext,
    ItemResult,
    ModelMetadata,
    PreparedInput,
    text_encoder_metadata,
)
from fleetserve_runtime.models.text_input import open_tokenizer, sample_text, text_token_ids

__all__ = [
    "OnnxEncoderHandler",
    "build_once",
    "file_digest",
    "private_cache",
    "quantized_path",
]

_TEXT_INPUTS = {"input_ids", "attention_mask", "token_type_ids"}
_BLOCK = 32
"""Weights and activations share one int8 scale per 32 values along the reduced axis."""
_INT8_COMPUTE = 4
"""MatMulNBits `accuracy_level` 4: activations quantised to int8 block by block, int8 GEMM."""
_SAME_AS_REQUESTED = 1
"""`OrtArenaCfg`'s arena_extend_strategy: grow by the request, so growth tracks need."""


def private_cache(cache_dir: Path, what: str) -> Path:
    """`cache_dir`, created owner-only; `ValueError` when another user owns it.

    A graph planted in someone else's directory under a shared temp dir would be run.
    """
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if cache_dir.stat().st_uid != os.getuid():
        msg = f"{what} cache {cache_dir} belongs to another user; set TMPDIR to a private one"
        raise ValueError(msg)
    return cache_dir


def build_once(target: Path, build: Callable[[Path], Path]) -> Path:
    """`target` (a file or a directory), built on first use.

    `build(scratch)` writes it under a fresh scratch directory beside `target` and returns
    what it wrote, which is renamed to `target` whole, so a concurrent or interrupted load
    never sees half of it; when two loads race, the first rename wins and both use it.
    """
    if target.exists():
        return target
    scratch = Path(tempfile.mkdtemp(dir=target.parent, suffix=".partial"))
    try:
        built = build(scratch)
        try:
            built.replace(target)
        except OSError:
            # A directory cannot replace a non-empty one: another load finished first.
            if not target.exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def quantized_path(source: Path, cache_dir: Path) -> Path:
    """The int8 graph of `source`, quantised once and cached by the digest of its files.

    The digest covers the graph and any external-data files named after it, so new weights
    under an old graph are quantised afresh.
    """
    private_cache(cache_dir, "int8")
    target = cache_dir / f"{file_digest(_graph_files(source))}.int8.onnx"
    return build_once(target, lambda scratch: _quantize(source, scratch / target.name))


def file_digest(paths: Sequence[Path], *extra: str) -> str:
    """Hex digest (32 characters) of the files' bytes, in order, then of `extra` strings."""
    digest = hashlib.sha256()
    for part in paths:
        with part.open("rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
    for text in extra:
        digest.update(text.encode())
    return digest.hexdigest()[:32]


def _quantize(source: Path, target: Path) -> Path:
    # Only int8 loads need onnx and the quantiser, which are slow to import.
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (  # type: ignore[import-untyped]
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(
        block_size=_BLOCK, is_symmetric=True, accuracy_level=_INT8_COMPUTE, bits=8
    )
    quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), algo_config=config)
    quantizer.process()
    quantizer.model.save_model_to_file(str(target), False)
    return target


class OnnxEncoderHandler:
    """`ModelHandler` for an ONNX text encoder with a `tokenizer.json` beside it."""

    def __init__(
        self,
        name: str,
        version: str,
        *,
        path: Path,
        max_sequence_length: int = 256,
        precision: PrecisionOptions = PrecisionOptions(),  # noqa: B008 (frozen, shared safely)
        cache_dir: Path | None = None,
    ) -> None:
        """Describe the model; nothing is read until `load`.

        Raises:
            ValueError: `precision` is bf16 (ONNX models are served in fp32 or int8).
        """
        if precision.precision == "bf16":
            msg = "precision bf16 is not available for ONNX models; use fp32 or int8"
            raise ValueError(msg)
        self._path = path
        self._limit = max_sequence_length
        self._precision = precision
        self._cache_dir = cache_dir or Path(tempfile.gettempdir()) / "fleetserve-onnx-int8"
        self._session: ort.InferenceSession | None = None
        self._run_options: ort.RunOptions | None = None
        """Options of every run; arena shrinkage while a batch's memory is measured."""
        self._tokenizer: Tokenizer | None = None
        self._inputs: tuple[str, ...] = ()
        self._output = ""
        self._pooled = False
        self._weights = 0
        self._metadata = text_encoder_metadata(
            name,
            version,
            platform="onnxruntime",
            width=-1,
            max_sequence_length=max_sequence_length,
        )

    @property
    def metadata(self) -> ModelMetadata:
        """Name, version, shapes and limits."""
        return self._metadata

    def weights_bytes(self) -> int:
        """Bytes of the graph file(s) the session loaded: its weights, to the memory budget."""
        return self._weights

    def load(self, device: torch.device) -> None:
        """Open the tokenizer and the session; quantise and guard when int8 is asked for.

        Raises:
            ValueError: the directory lacks `tokenizer.json`, the graph is not a text
                encoder this handler can drive, or the device is not the CPU.
            AccuracyError: the int8 graph failed the accuracy guard.
        """
        if device.type != "cpu":
            msg = f"ONNX models run on the CPU only, not on {device.type}"
            raise ValueError(msg)
        self._open_graph()
        if self._precision.precision == "int8":
            self._quantise(embed_texts(self, GUARD_TEXTS, device), device)

    def _open_graph(self) -> None:
        """Open the tokenizer beside `self._path` and a session on the graph."""
        if not self._path.is_file():
            msg = f"ONNX model {self._path} does not exist"
            raise ValueError(msg)
        tokenizer_file = self._path.parent / "tokenizer.json"
        if not tokenizer_file.is_file():
            msg = f"ONNX model {self._path} needs tokenizer.json beside it ({tokenizer_file})"
            raise ValueError(msg)
        self._tokenizer = open_tokenizer(tokenizer_file)
        self._open(self._path)

    def _quantise(self, reference: npt.NDArray[np.float32], device: torch.device) -> None:
        """Serve the int8 graph if its guard embeddings reach the floor to `reference`."""
        self._open(quantized_path(self._path, self._cache_dir))
        candidate = embed_texts(self, GUARD_TEXTS, device)
        report = check("int8", reference, candidate, floor=self._precision.min_cosine)
        self._metadata = replace(
            self._metadata, precision="int8", min_cosine=round(report.min_cosine, 6)
        )

    def batch_peak_bytes(self, run: Callable[[], object]) -> int:
        """Peak resident-memory growth of one batch, `run()`, with the arena shrunk around it.

        Raises:
            RuntimeError: `load` has not been called.
        """
        session = self._session
        if session is None:
            raise RuntimeError("OnnxEncoderHandler.load() has not been called")
        shrink = ort.RunOptions()
        shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        # A one-token run hands back what earlier batches left in the arena.
        tiny = {name: np.ones((1, 1), dtype=np.int64) for name in self._inputs}
        if "token_type_ids" in tiny:
            tiny["token_type_ids"] = np.zeros((1, 1), dtype=np.int64)
        session.run([self._output], tiny, shrink)
        self._run_options = shrink
        try:
            return resident_peak_bytes(run)
        finally:
            self._run_options = None

    def _open(self, path: Path) -> None:
        _share_arena()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = torch.get_num_threads()
        options.add_session_config_entry("session.use_env_allocators", "1")
        try:
            session = ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # ORT raises its own untyped errors for bad graphs
            msg = f"ONNX Runtime cannot load {path}: {exc}"
            raise ValueError(msg) from exc
        names = {i.name for i in session.get_inputs()}
        if "input_ids" not in names or not names <= _TEXT_INPUTS:
            msg = (
                f"ONNX model {self._path} takes inputs {sorted(names)}; a text encoder takes "
                "input_ids and optionally attention_mask and token_type_ids"
            )
            raise ValueError(msg)
        outputs = session.get_outputs()
        pooled = [o for o in outputs if len(o.shape) == 2]
        hidden = [o for o in outputs if len(o.shape) == 3]
        if not pooled and not hidden:
            msg = (
                f"ONNX model {self._path} has no [batch, hidden] or [batch, sequence, hidden] "
                f"output (outputs: {[(o.name, o.shape) for o in outputs]})"
            )
            raise ValueError(msg)
        self._output = (pooled or hidden)[0].name
        self._pooled = bool(pooled)
        self._inputs = tuple(i.name for i in session.get_inputs())
        self._session = session
        self._weights = sum(part.stat().st_size for part in _graph_files(path))

    def preprocess(self, instance: object, *, truncate: bool) -> PreparedInput:
        """Tokenise one text with the model's special tokens.

        Raises:
            InvalidInput: the instance is not a non-empty string with tokens.
            InputTooLong: the text exceeds `max_sequence_length` and `truncate` is false.
            RuntimeError: `load` has not been called.
        """
        ids, truncated = text_token_ids(
            instance,
            self._tokenizer,
            handler="OnnxEncoderHandler",
            limit=self._limit,
            truncate=truncate,
            special_tokens=0,
        )
        return PreparedInput(length=len(ids), data=ids, truncated=truncated)

    def sample_instance(self, length: int) -> str:
        """A text of about `length` tokens (two are special tokens for BERT tokenizers)."""
        return sample_text(length, self._limit)

    def collate(
        self, items: Sequence[PreparedInput], ctx: CollateContext
    ) -> dict[str, npt.NDArray[np.int64]]:
        """Pad the batch to `ctx.layout.pad_to` (packed layouts are padded too) with its mask.

        Raises:
            ValueError: the batch is empty.
        """
        if not items:
            raise ValueError("cannot collate an empty batch")
        width = max(ctx.layout.pad_to, max(item.length for item in items))
        ids = ctx.alloc.empty((len(items), width), torch.int64).numpy()
        mask = ctx.alloc.empty((len(items), width), torch.int64).numpy()
        ids.fill(0)
        mask.fill(0)
        for row, item in enumerate(items):
            ids[row, : item.length] = item.data
            mask[row, : item.length] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return feeds

    def forward(self, batch: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        """Run the session; returns `[B, hidden]` unit-norm embeddings."""
        session = self._session
        if session is None:
            raise RuntimeError("OnnxEncoderHandler.load() has not been called")
        feeds = {name: batch[name] for name in self._inputs}
        out = np.asarray(session.run([self._output], feeds, self._run_options)[0], dtype=np.float32)
        if not self._pooled:
            weights = batch["attention_mask"].astype(np.float32)[:, :, None]
            out = (out * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        normalised: npt.NDArray[np.float32] = out / np.maximum(norms, 1e-12)
        return normalised

    def postprocess(self, output: npt.NDArray[np.float32], count: int) -> list[ItemResult]:
        """One embedding row per item.

        Raises:
            ValueError: `output` does not hold exactly `count` rows.
        """
        if output.shape[0] != count:
            raise ValueError(f"expected {count} embeddings, got {output.shape[0]}")
        return list(output)


@functools.cache
def _share_arena() -> None:
    """Register, once per process, the CPU arena every session allocates from."""
    cpu = ort.OrtMemoryInfo(
        "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
    )
    # max_mem 0 and -1 for the chunk sizes keep ONNX Runtime's defaults.
    ort.create_and_register_allocator(cpu, ort.OrtArenaCfg(0, _SAME_AS_REQUESTED, -1, -1))


def _graph_files(path: Path) -> list[Path]:
    """The graph file and the external-data files beside it that carry its name."""
    return sorted(part for part in path.parent.glob(f"{path.name}*") if part.is_file())
