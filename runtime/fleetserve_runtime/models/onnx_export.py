"""Export the built-in MiniLM encoder to an ONNX model directory `OnnxEncoderHandler` serves.

The graph takes `input_ids` and `attention_mask` (int64, dynamic batch and sequence) and
returns `last_hidden_state` `[batch, sequence, 384]`, the shape Hugging Face exports have,
so the ONNX handler pools it itself. `tokenizer.json` is copied from the MiniLM package.
The CPU default backend exports with it at first load (`models.minilm_onnx`), as do the
tests and the precision benchmark; a team bringing its own encoder exports it with its own
tooling to the same layout.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn

from fleetserve_runtime.models.bert import BertEncoder, PaddedBatch
from fleetserve_runtime.models.minilm import MiniLMHandler, packaged_directory

__all__ = ["export_minilm"]

_QUIETED_LOGGERS = {
    # Each torchvision operator it cannot register, a warning per line; MiniLM uses none.
    "torch.onnx._internal.exporter._registration": logging.ERROR,
    # The graph optimizer's notes ("Replaced initializer ...", constant folding, rewrite
    # rules), dozens of lines at INFO.
    "onnx_ir": logging.WARNING,
    "onnxscript": logging.WARNING,
}
"""Loggers that would fill every pod's first load with lines about the export's internals."""


class _LastHiddenState(nn.Module):
    def __init__(self, encoder: BertEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder.hidden_padded(PaddedBatch(input_ids, attention_mask.bool()))


def export_minilm(directory: Path) -> Path:
    """Write `model.onnx` (weights inline) and `tokenizer.json` into `directory`; the graph."""
    handler = MiniLMHandler("export", "1")
    handler.load(torch.device("cpu"))
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "model.onnx"
    example = (torch.full((2, 8), 1000, dtype=torch.int64), torch.ones(2, 8, dtype=torch.int64))
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    axes = {0: batch, 1: sequence}
    loggers = {name: logging.getLogger(name) for name in _QUIETED_LOGGERS}
    levels = {name: logger.level for name, logger in loggers.items()}
    for name, logger in loggers.items():
        logger.setLevel(_QUIETED_LOGGERS[name])
    with warnings.catch_warnings():
        # Both inputs share the batch and sequence axes on purpose; the exporter says so.
        warnings.filterwarnings("ignore", message="# The axis name", category=UserWarning)
        try:
            torch.onnx.export(
                _LastHiddenState(handler.encoder).eval(),
                example,
                str(target),
                output_names=["last_hidden_state"],
                dynamic_shapes={"input_ids": axes, "attention_mask": axes},
                external_data=False,
                dynamo=True,
                verbose=False,
            )
        finally:
            for name, logger in loggers.items():
                logger.setLevel(levels[name])
    shutil.copyfile(packaged_directory() / "tokenizer.json", directory / "tokenizer.json")
    return target
