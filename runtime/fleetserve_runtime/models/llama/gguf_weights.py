"""A GGUF file's tensors as Llama weights.

Each is dequantised to fp32 and renamed to the reference implementation's parameter name, and
the q and k rows are put back in the reference order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import gguf
import numpy as np
import torch

from fleetserve_runtime.models.llama.config import LlamaConfig

__all__ = [
    "GGUF_LAYER_NAMES",
    "SUPPORTED_GGUF_TYPES",
    "gguf_weights",
]

_Q = gguf.GGMLQuantizationType
SUPPORTED_GGUF_TYPES = frozenset(
    {
        _Q.F32,
        _Q.F16,
        _Q.BF16,
        _Q.Q4_0,
        _Q.Q4_1,
        _Q.Q5_0,
        _Q.Q5_1,
        _Q.Q8_0,
        _Q.Q2_K,
        _Q.Q3_K,
        _Q.Q4_K,
        _Q.Q5_K,
        _Q.Q6_K,
    }
)
"""Tensor types the loader dequantises: the float types and llama.cpp's common quantisations."""

_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""A layer tensor's GGUF part (`blk.N.<part>.weight`) -> its reference name in that layer."""
_GGUF_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_weights(
    tensors: Mapping[str, gguf.ReaderTensor], config: LlamaConfig
) -> dict[str, torch.Tensor]:
    """The file's tensors as fp32 weights by reference name; unsupported types are refused."""
    names = {gguf_name: _hf_name(gguf_name) for gguf_name in tensors}
    unsupported = {
        name: tensor.tensor_type.name
        for name, tensor in tensors.items()
        if tensor.tensor_type not in SUPPORTED_GGUF_TYPES
    }
    if unsupported:
        name, kind = next(iter(unsupported.items()))
        supported = ", ".join(sorted(t.name for t in SUPPORTED_GGUF_TYPES))
        raise ValueError(
            f"tensor {name} is quantised as {kind}, which is not supported "
            f"({len(unsupported)} tensors affected); supported types: {supported}"
        )
    weights: dict[str, torch.Tensor] = {}
    for gguf_name, tensor in tensors.items():
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except (ValueError, NotImplementedError) as exc:
            raise ValueError(f"cannot dequantise {gguf_name}: {exc}") from exc
        # The float types come back as views of the read-only file mapping; the model needs
        # tensors of its own.
        if values.dtype != np.float32 or not values.flags.writeable:
            values = values.astype(np.float32)
        weight = torch.from_numpy(values)
        hf_name = names[gguf_name]
        if hf_name.endswith("q_proj.weight"):
            weight = _unpermute_rotary_rows(weight, config.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            weight = _unpermute_rotary_rows(weight, config.num_kv_heads)
        weights[hf_name] = weight
    return weights


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[gguf_name]
    match = _GGUF_LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in GGUF_LAYER_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name} is not part of a Llama model")
    return f"model.layers.{match.group(1)}.{GGUF_LAYER_NAMES[match.group(2)]}.weight"


def _unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: per head, from (half, pair) back to (pair, half).

    The converter stores each head's rows as `reshape(2, d/2).T`, interleaving the two rotary
    halves for llama.cpp's adjacent-pair RoPE; the reference rotates the halves as blocks.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
        .contiguous()
    )
