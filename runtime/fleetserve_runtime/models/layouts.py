"""What a model directory holds, told by its content: `file:///models/model` names no format.

A directory fetched from object storage, a registry or a Hugging Face repository holds
whatever its owner stored there, so the runtime looks before it loads:

| the directory holds                                  | it is                 | task     |
| ---------------------------------------------------- | --------------------- | -------- |
| `handler.py`                                         | a plug-in             | its own  |
| exactly one `*.gguf`                                 | a GGUF checkpoint     | generate |
| `model.onnx` (+ `tokenizer.json`)                    | an ONNX encoder       | embed    |
| `config.json` with model_type `llama` + safetensors  | a Llama checkpoint    | generate |
| `config.json` with model_type `bert` + safetensors   | a BERT encoder        | embed    |

Markers of two layouts at once (a `handler.py` beside a checkpoint, a GGUF file beside a
`config.json`, `model.onnx` beside `model.safetensors`) are refused rather than guessed at,
and so is anything else, each with a message naming what was found. Pickled weights
(`pytorch_model.bin` and the like) are refused without being opened: unpickling runs code.
Only file names and `config.json` are read here; each layout's own reader checks the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fleetserve_runtime.models.json_file import read_json_object

__all__ = ["Layout", "identify"]

LayoutKind = Literal["plugin", "gguf", "onnx", "llama", "bert"]
ServedTask = Literal["embed", "generate"]

PLUGIN = "handler.py"
CONFIG = "config.json"
ONNX = "model.onnx"
_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""Suffixes of weights saved with Python's pickle (PyTorch's `torch.save`)."""
_LLAMA_ARCHITECTURE = "LlamaForCausalLM"
_LISTED = 12
"""Most entries a refusal lists of what a directory holds."""


@dataclass(frozen=True, slots=True)
class Layout:
    """A directory's model: what it is, what to load, and its task."""

    kind: LayoutKind
    path: Path
    """What the loader opens: the directory, or the one file (`*.gguf`, `model.onnx`)."""
    task: ServedTask | None
    """`embed` or `generate`; None for a plug-in, whose handler tells."""
    description: str
    """What was found, for messages: e.g. `a BERT encoder (config.json model_type 'bert')`."""


def identify(directory: Path) -> Layout:
    """The model `directory` holds.

    Raises:
        ValueError: it holds no model the runtime serves, two at once, or pickled weights;
            the message names what was found.
    """
    names = sorted(entry.name for entry in directory.iterdir())
    present = set(names)
    ggufs = [name for name in names if name.endswith(".gguf")]
    checkpoints = [name for name in (CONFIG, ONNX, *ggufs) if name in present]
    if PLUGIN in present:
        if checkpoints:
            raise ValueError(
                f"{directory} holds {PLUGIN} (a plug-in) and {', '.join(checkpoints)} (a "
                "checkpoint): keep one, a plug-in or a checkpoint"
            )
        return Layout("plugin", directory, None, f"a plug-in ({PLUGIN})")
    if len(ggufs) > 1:
        raise ValueError(
            f"{directory} holds {len(ggufs)} GGUF files ({', '.join(ggufs)}); a GGUF model "
            "directory holds exactly one"
        )
    if ggufs:
        others = [name for name in (CONFIG, ONNX) if name in present]
        if others:
            raise ValueError(
                f"{directory} holds a GGUF file ({ggufs[0]}) and {', '.join(others)}: keep one "
                "checkpoint"
            )
        return Layout("gguf", directory / ggufs[0], "generate", f"a GGUF checkpoint ({ggufs[0]})")
    if ONNX in present:
        if "model.safetensors" in present:
            raise ValueError(
                f"{directory} holds both {ONNX} and model.safetensors: keep one, the ONNX "
                "graph or the safetensors checkpoint"
            )
        return Layout("onnx", directory / ONNX, "embed", f"an ONNX encoder ({ONNX})")
    if CONFIG in present:
        return _checkpoint(directory, names)
    raise ValueError(
        f"{directory} holds no model the runtime serves ({_listing(names)}); it serves a "
        "directory with config.json and model.safetensors (BERT or Llama), exactly one *.gguf, "
        f"{ONNX} with tokenizer.json, or {PLUGIN}"
    )


def _checkpoint(directory: Path, names: list[str]) -> Layout:
    """A `config.json` directory: a BERT encoder or a Llama checkpoint, in safetensors."""
    config_file = directory / CONFIG
    raw = read_json_object(config_file)
    model_type, architectures = raw.get("model_type"), raw.get("architectures")
    found = f"config.json model_type {model_type!r}"
    if not any(name.endswith(".safetensors") for name in names):
        pickles = [name for name in names if name.endswith(_PICKLES)]
        if pickles:
            raise ValueError(
                f"{directory} holds {', '.join(pickles)} and no *.safetensors: pickled weights "
                "run code when they are loaded, so the runtime reads safetensors only; convert "
                "them (e.g. `save_pretrained(..., safe_serialization=True)` in transformers)"
            )
    is_llama = model_type == "llama" or (
        isinstance(architectures, list) and _LLAMA_ARCHITECTURE in architectures
    )
    if is_llama:
        return Layout("llama", directory, "generate", f"a Llama checkpoint ({found})")
    if model_type == "bert":
        return Layout("bert", directory, "embed", f"a BERT encoder ({found})")
    raise ValueError(
        f"{config_file}: model_type {model_type!r} (architectures {architectures!r}) is not "
        f"served; a config.json directory serves model_type 'bert' (an encoder) or "
        f"'llama' ({_LLAMA_ARCHITECTURE})"
    )


def _listing(names: list[str]) -> str:
    if not names:
        return "it is empty"
    shown = ", ".join(names[:_LISTED])
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    return f"found: {shown}{more}"
