"""A checkpoint directory's `*.safetensors` weights as fp32 tensors under their own names.

The weights are one file, or the shards that `model.safetensors.index.json` lists. The index
ships with the weights, so its file names are input: each must stay inside the directory.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from fleetserve_runtime.models.json_file import read_json_object

__all__ = ["safetensors_weights"]


def safetensors_weights(path: Path, *, tie_word_embeddings: bool) -> dict[str, torch.Tensor]:
    """Every weight in the directory's safetensors files, as fp32 under its own name."""
    index_file = path / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map = read_json_object(index_file).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_file} has no weight_map")
        files = sorted(
            {
                _weight_file(path, name, f"{index_file}: weight_map[{tensor!r}]")
                for tensor, name in weight_map.items()
            }
        )
    else:
        files = sorted(
            _weight_file(path, file.name, f"{path}: {file.name}")
            for file in path.glob("*.safetensors")
        )
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as shard:
                for name in shard.keys():  # noqa: SIM118 - safe_open is no Mapping
                    # Old exports store RoPE's inverse frequencies; they derive from the config.
                    if name.endswith("rotary_emb.inv_freq"):
                        continue
                    weights[name] = shard.get_tensor(name).to(torch.float32)
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"{file} is not a readable safetensors file: {exc}") from exc
    if tie_word_embeddings:
        # Tied models use the embedding as the output layer even where a copy was saved.
        weights.pop("lm_head.weight", None)
    return weights


def _weight_file(directory: Path, name: object, entry: str) -> Path:
    """`directory / name`, refused unless it is a file name that stays inside `directory`.

    The index is a JSON file shipped with the weights, so its entries are input: `../`, an
    absolute path or a symlink out of the directory would read whatever file the runtime can.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{entry} is {name!r}, not a file name")
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise ValueError(f"{entry} is {name!r}, which leads outside the checkpoint directory")
    resolved = (directory / relative).resolve()
    if not resolved.is_relative_to(directory.resolve()):
        raise ValueError(
            f"{entry} is {name!r}, which resolves to {resolved}, outside the checkpoint directory"
        )
    return resolved
