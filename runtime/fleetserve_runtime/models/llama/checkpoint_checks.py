"""What a Llama checkpoint must satisfy in either format: its sizes and its weights' shapes.

A checkpoint is input from disk: the sizes in its configuration set the RoPE tables and the
model's allocations, so each is bounded here before anything is built from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from fleetserve_runtime.models.llama.config import LlamaConfig

__all__ = [
    "MAX_CONTEXT_LENGTH",
    "check_weights",
    "checked_config",
]

MAX_CONTEXT_LENGTH = 1_048_576
"""Largest context a checkpoint may declare (`max_position_embeddings`, `llama.context_length`).

It sizes the RoPE tables built at load (cos and sin for every position), so a file declaring
2**31 positions would allocate hundreds of GB before serving anything. The same ceiling as
`generation.max_context`."""


def checked_config(config: LlamaConfig) -> LlamaConfig:
    """`config`, once its sizes are positive, bounded and consistent with each other."""
    sizes = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
    }
    for name, size in sizes.items():
        if size <= 0:
            raise ValueError(f"{name} must be positive, got {size}")
    if config.max_position_embeddings > MAX_CONTEXT_LENGTH:
        raise ValueError(
            f"the checkpoint declares a context of {config.max_position_embeddings} positions "
            "(max_position_embeddings, GGUF llama.context_length), over MAX_CONTEXT_LENGTH "
            f"({MAX_CONTEXT_LENGTH})"
        )
    if config.num_heads % config.num_kv_heads:
        raise ValueError(
            f"{config.num_heads} attention heads do not share {config.num_kv_heads} KV heads evenly"
        )
    if config.head_dim % 2:
        raise ValueError(f"head_dim {config.head_dim} is odd; RoPE rotates pairs")
    return config


def _expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    hidden, inner = config.hidden_size, config.intermediate_size
    q_rows = config.num_heads * config.head_dim
    kv_rows = config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    per_layer: dict[str, tuple[int, ...]] = {
        "input_layernorm": (hidden,),
        "post_attention_layernorm": (hidden,),
        "self_attn.q_proj": (q_rows, hidden),
        "self_attn.k_proj": (kv_rows, hidden),
        "self_attn.v_proj": (kv_rows, hidden),
        "self_attn.o_proj": (hidden, q_rows),
        "mlp.gate_proj": (inner, hidden),
        "mlp.up_proj": (inner, hidden),
        "mlp.down_proj": (hidden, inner),
    }
    for layer in range(config.num_layers):
        for part, shape in per_layer.items():
            shapes[f"model.layers.{layer}.{part}.weight"] = shape
    return shapes


def check_weights(config: LlamaConfig, weights: Mapping[str, torch.Tensor]) -> None:
    """Refuse weights that are missing, unexpected or of another shape than `config` gives."""
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = [
        f"{name} {tuple(weights[name].shape)} (expected {shape})"
        for name, shape in expected.items()
        if name in weights and tuple(weights[name].shape) != shape
    ]
    problems = [
        f"{label}: {_first(items)}"
        for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", wrong))
        if items
    ]
    if problems:
        raise ValueError(f"weights do not match the configuration; {'; '.join(problems)}")


def _first(items: Iterable[str], limit: int = 3) -> str:
    listed = list(items)
    more = f" and {len(listed) - limit} more" if len(listed) > limit else ""
    return ", ".join(listed[:limit]) + more
