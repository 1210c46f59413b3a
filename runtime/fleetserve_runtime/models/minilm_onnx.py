"""The built-in MiniLM run by ONNX Runtime: the CPU fp32 default (`backend: auto`).

The same packaged weights as `models.minilm`, exported once to an ONNX graph
(`models.onnx_export`) and served by `OnnxEncoderHandler`, whose fused CPU kernels cost
about 1.46x less CPU per request than our torch encoder at identical precision.

The graph is cached in `$TMPDIR/fleetserve-onnx-minilm/<key>/` (`model.onnx` and
`tokenizer.json`), a directory only its owner may use (`onnx_model.private_cache`), where
`<key>` digests the packaged weights, config and tokenizer and the exporting torch's version,
so new weights or a new exporter export afresh. The export (about 5 s on one busy core) is
written beside the cache entry and renamed into place whole (`onnx_model.build_once`).

Every load runs the accuracy guard: the guard texts' embeddings from the graph must reach
`precision_min_cosine` to the torch fp32 MiniLM's, and the figure goes into the metadata
(`min_cosine`). A cached graph that ONNX Runtime cannot open or that fails the guard (a
corrupted file) is deleted and exported once more; a freshly exported graph that fails is a
load error. With `precision: int8` the guarded graph is then quantised as any ONNX model is,
and guarded against the torch fp32 embeddings too.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from fleetserve_runtime.models.accuracy import (
    GUARD_TEXTS,
    AccuracyError,
    AccuracyReport,
    PrecisionOptions,
    check,
    embed_texts,
)
from fleetserve_runtime.models.base import embedding_output
from fleetserve_runtime.models.minilm import (
    EMBEDDING_DIM,
    MiniLMHandler,
    check_max_sequence_length,
    packaged_directory,
)
from fleetserve_runtime.models.onnx_model import (
    OnnxEncoderHandler,
    build_once,
    file_digest,
    private_cache,
)

__all__ = ["MiniLMOnnxHandler", "graph_key"]

log = logging.getLogger("fleetserve.runtime")

_PACKAGED = ("model.safetensors", "config.json", "tokenizer.json")
_CPU = torch.device("cpu")


def graph_key() -> str:
    """Cache key of the exported graph: the packaged files' digest and torch's version."""
    model_dir = packaged_directory()
    return file_digest([model_dir / name for name in _PACKAGED], torch.__version__)


def _export(scratch: Path) -> Path:
    # onnx_export imports the exporter's dependencies; only a cache miss pays for them.
    from fleetserve_runtime.models.onnx_export import export_minilm

    started = time.perf_counter()
    graph = export_minilm(scratch / "graph").parent
    log.info(
        "exported the MiniLM graph to ONNX",
        extra={"seconds": round(time.perf_counter() - started, 3)},
    )
    return graph


class MiniLMOnnxHandler(OnnxEncoderHandler):
    """`ModelHandler` for the built-in MiniLM's exported graph, run by ONNX Runtime."""

    def __init__(
        self,
        name: str,
        version: str,
        *,
        max_sequence_length: int = 256,
        precision: PrecisionOptions = PrecisionOptions(),  # noqa: B008 (frozen, shared safely)
        cache_dir: Path | None = None,
    ) -> None:
        """Describe the model; nothing is read or exported until `load`.

        `cache_dir` holds the exported graphs (default `$TMPDIR/fleetserve-onnx-minilm`);
        int8 graphs go where any ONNX model's do.

        Raises:
            ValueError: `max_sequence_length` is outside [3, 512], or `precision` is bf16.
        """
        check_max_sequence_length(max_sequence_length)
        self._graphs = cache_dir or Path(tempfile.gettempdir()) / "fleetserve-onnx-minilm"
        # The graph's real path is known once `load` has found or exported it.
        super().__init__(
            name,
            version,
            path=self._graphs / "unexported" / "model.onnx",
            max_sequence_length=max_sequence_length,
            precision=precision,
        )
        self._metadata = replace(self._metadata, outputs=(embedding_output(EMBEDDING_DIM),))

    @property
    def graph_dir(self) -> Path:
        """The directory of the graph this handler serves (known once loaded)."""
        return self._path.parent

    def load(self, device: torch.device) -> None:
        """Export (or reuse) the graph, open it and run the accuracy guard against torch.

        Raises:
            ValueError: the device is not the CPU, or the cache directory belongs to
                another user.
            AccuracyError: a freshly exported graph strays from torch fp32 (or the int8
                graph does).
        """
        if device.type != "cpu":
            msg = f"backend onnxruntime runs on the CPU only, not on {device.type}"
            raise ValueError(msg)
        reference = _torch_embeddings(self._limit)
        target = private_cache(self._graphs, "MiniLM graph") / graph_key()
        cached = target.exists()
        try:
            report = self._open_guarded(target, reference)
        except ValueError as exc:
            if not cached:
                raise
            log.warning(
                "cached MiniLM graph unusable, exporting it again",
                extra={"graph": str(target), "reason": str(exc)},
            )
            shutil.rmtree(target)
            report = self._open_guarded(target, reference)
        if self._precision.precision == "int8":
            self._quantise(reference, device)
        else:
            self._metadata = replace(self._metadata, min_cosine=round(report.min_cosine, 6))

    def _open_guarded(self, target: Path, reference: npt.NDArray[np.float32]) -> AccuracyReport:
        """Open the graph in `target` (exporting it when absent) and guard it against torch."""
        self._path = build_once(target, _export) / "model.onnx"
        self._open_graph()
        candidate = embed_texts(self, GUARD_TEXTS, _CPU)
        try:
            return check("fp32", reference, candidate, floor=self._precision.min_cosine)
        except AccuracyError as exc:
            msg = (
                f"the ONNX Runtime graph of MiniLM in {target} strays from torch (backend "
                f"torch serves without it): {exc}"
            )
            raise AccuracyError(msg) from exc


def _torch_embeddings(max_sequence_length: int) -> npt.NDArray[np.float32]:
    """The torch fp32 MiniLM's embeddings of the guard texts: the reference for the graph."""
    handler = MiniLMHandler("reference", "1", max_sequence_length=max_sequence_length)
    handler.load(_CPU)
    return embed_texts(handler, GUARD_TEXTS, _CPU)
