"""A Llama-family checkpoint as the loaders yield it: the architecture, fp32 weights, a codec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetserve_runtime.models.causal_lm import TextCodec

if TYPE_CHECKING:
    import torch

__all__ = [
    "Checkpoint",
    "LlamaConfig",
]


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """The architecture of a Llama-family decoder, as `config.json` or GGUF metadata give it."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    rope_scaling: Mapping[str, float | str] | None = None
    """Llama 3 style frequency scaling (`rope_type: llama3`, factors); None for plain RoPE."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A loaded checkpoint: architecture, fp32 weights by Llama parameter name, tokenizer.

    Parameter names are those of the reference implementation (`model.embed_tokens.weight`,
    `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
    `model.layers.{i}.mlp.{gate,up,down}_proj.weight`,
    `model.layers.{i}.{input,post_attention}_layernorm.weight`, `model.norm.weight`,
    `lm_head.weight` unless tied), with q/k in the reference's (un-permuted) row order.
    """

    config: LlamaConfig
    weights: Mapping[str, torch.Tensor]
    codec: TextCodec
    source: str
    """Where it came from, for logs and the metadata endpoint."""
