"""A Hugging Face style checkpoint directory to a `Checkpoint`.

The directory holds `config.json` (a `LlamaForCausalLM`), `*.safetensors` weights and
`tokenizer.json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetserve_runtime.models.json_file import read_json_object
from fleetserve_runtime.models.llama.checkpoint_checks import check_weights, checked_config
from fleetserve_runtime.models.llama.config import Checkpoint, LlamaConfig
from fleetserve_runtime.models.llama.safetensors_weights import safetensors_weights
from fleetserve_runtime.models.llama.tokenizer import directory_tokenizer

__all__ = ["load_directory"]

_LLAMA_ARCHITECTURE = "LlamaForCausalLM"


def load_directory(path: Path) -> Checkpoint:
    """The checkpoint in directory `path`; a `ValueError` names the file and the problem."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} has no config.json (a Llama checkpoint directory needs one)")
    raw = read_json_object(config_file)
    config = _directory_config(config_file, raw)
    generation = read_json_object(path / "generation_config.json")
    eos_ids = {*_ids(raw.get("eos_token_id")), *_ids(generation.get("eos_token_id"))}
    codec = directory_tokenizer(path, eos_token_ids=eos_ids)
    weights = safetensors_weights(path, tie_word_embeddings=config.tie_word_embeddings)
    try:
        check_weights(config, weights)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    return Checkpoint(config=config, weights=weights, codec=codec, source=str(path))


def _directory_config(config_file: Path, raw: Mapping[str, Any]) -> LlamaConfig:
    architectures = raw.get("architectures")
    is_llama = (
        _LLAMA_ARCHITECTURE in architectures
        if isinstance(architectures, list)
        else architectures is None and raw.get("model_type") == "llama"
    )
    if not is_llama:
        raise ValueError(
            f"{config_file}: architectures {architectures!r} (model_type "
            f"{raw.get('model_type')!r}) is not supported; only {_LLAMA_ARCHITECTURE}"
        )
    refused = {
        "quantization_config": raw.get("quantization_config") is not None,
        "attention_bias": bool(raw.get("attention_bias", False)),
        "mlp_bias": bool(raw.get("mlp_bias", False)),
        "hidden_act": raw.get("hidden_act", "silu") != "silu",
    }
    if any(refused.values()):
        bad = ", ".join(f"{key}={raw.get(key)!r}" for key, on in refused.items() if on)
        raise ValueError(f"{config_file}: {bad} is not supported by the Llama engine")
    try:
        hidden_size = int(raw["hidden_size"])
        num_heads = int(raw["num_attention_heads"])
        theta, scaling = _rope(config_file, raw)
        return checked_config(
            LlamaConfig(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden_size,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
                head_dim=int(raw.get("head_dim") or hidden_size // max(num_heads, 1)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                rope_scaling=scaling,
            )
        )
    except KeyError as exc:
        raise ValueError(f"{config_file} has no {exc.args[0]}") from exc
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{config_file}: {exc}") from exc


def _rope(config_file: Path, raw: Mapping[str, Any]) -> tuple[float, dict[str, float | str] | None]:
    """RoPE base and Llama 3 scaling, from transformers 5's `rope_parameters` or 4's keys."""
    parameters = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(parameters.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ValueError(f"{config_file}: RoPE type {kind!r} is not supported (default, llama3)")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [key for key in keys if key not in parameters]
    if missing:
        raise ValueError(f"{config_file}: llama3 RoPE scaling lacks {', '.join(missing)}")
    return theta, {"rope_type": "llama3", **{key: float(parameters[key]) for key in keys}}


def _ids(value: object) -> list[int]:
    """`eos_token_id` as configurations write it: absent, one id, or a list."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []
