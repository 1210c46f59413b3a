"""INT8 for the CPU track: the encoder's Linear layers in int8, everything else in fp32.

Each `nn.Linear` of the transformer blocks (fused QKV, attention output, both feed-forward
GEMMs) becomes an `Int8Linear`: weights int8 with one scale per output channel, activations
quantised on the fly with one scale per token (row), the product accumulated in int32 and
rescaled to fp32 (`models.int8_matmul`, shared with the Llama's int8 weights). Embeddings,
LayerNorms, attention and pooling stay fp32.

Why not `torch.ao.quantization.quantize_dynamic` or ONNX Runtime's `quantize_dynamic`: both
quantise activations with one scale per tensor, so the few outlier channels BERT models carry
squeeze every other token into a handful of levels; on MiniLM the accuracy guard's texts came
out at a minimum cosine of 0.81 (per-tensor weights) and 0.89 (per-channel weights) against
fp32 (ONNX Runtime: 0.96), under the 0.99 floor. Per-token scales alone reach about 0.98; a
SmoothQuant step (`smoothing`,
alpha 0.5) moves part of each outlier channel's range from the activations into the weights
before quantising and lifts it over 0.99, at the same speed (see
docs/explanation/precision.md).

The smoothing factors come from fp32 activations of `CALIBRATION_TEXTS`, which share no text
with the accuracy guard's set, so the guard checks texts the quantiser has not seen.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from fleetserve_runtime.models.bert import BertEncoder
from fleetserve_runtime.models.int8_matmul import EPS, Int8Weight, int8_matmul, quantize_weight

__all__ = [
    "CALIBRATION_TEXTS",
    "SMOOTHING_ALPHA",
    "Int8Linear",
    "activation_ranges",
    "quantize_encoder",
    "smoothing",
]

SMOOTHING_ALPHA = 0.5
"""How much of each input channel's range moves into the weights (SmoothQuant's alpha)."""

CALIBRATION_TEXTS = (
    "A man is eating food.",
    "The new movie is awesome!",
    "Where can I buy cheap flights to Rome in October?",
    "Two dogs are playing in the snow near the old barn.",
    "The database migration failed halfway, so we rolled back to yesterday's snapshot.",
    "Interest rates are expected to fall slowly over the next two years.",
    "yes",
    "Symptoms include headache, nausea and sensitivity to light.",
)
"""Texts whose fp32 activations set the smoothing factors; none is in the guard's set."""

_LINEARS = ("qkv", "attention_out", "ffn_in", "ffn_out")


class Int8Linear(nn.Module):
    """`y = x Wᵀ + b` with int8 weights (per output channel) and int8 activations (per token).

    `smooth` divides each input channel before quantising; the weights were multiplied by
    it, so the product is unchanged in exact arithmetic.
    """

    weight_t: torch.Tensor
    """`[in, out]` int8 weights, smoothed."""
    weight_scale: torch.Tensor
    """`[out]` fp32 scale of each output channel."""
    inverse_smooth: torch.Tensor
    """`[in]` fp32 divisor of each input channel."""
    bias: torch.Tensor

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor) -> None:
        super().__init__()
        weight = quantize_weight(linear.weight.detach().t(), smooth)
        self.register_buffer("weight_t", weight.values)
        self.register_buffer("weight_scale", weight.scale)
        self.register_buffer("inverse_smooth", weight.inverse_smooth)
        bias = linear.bias.detach() if linear.bias is not None else torch.zeros(len(weight.scale))
        self.register_buffer("bias", bias.clone())
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Quantise `x` row by row, multiply in int8, rescale to fp32."""
        weight = Int8Weight(self.weight_t, self.weight_scale, self.inverse_smooth)
        out = int8_matmul(x.reshape(-1, x.shape[-1]), weight) + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def activation_ranges(encoder: BertEncoder, run: Callable[[], object]) -> dict[str, torch.Tensor]:
    """Largest |input| of each input channel of every block Linear while `run()` runs fp32."""
    ranges: dict[str, torch.Tensor] = {}
    hooks = []
    for index, layer in enumerate(encoder.blocks):
        for attr in _LINEARS:
            key = f"{index}.{attr}"

            def record(_: nn.Module, args: tuple[torch.Tensor, ...], key: str = key) -> None:
                seen = args[0].reshape(-1, args[0].shape[-1]).abs().amax(dim=0).float()
                ranges[key] = torch.maximum(ranges[key], seen) if key in ranges else seen

            hooks.append(getattr(layer, attr).register_forward_pre_hook(record))
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return ranges


def smoothing(activation: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel factor `max|X|^alpha / max|W|^(1 - alpha)`."""
    weight_range = weight.abs().amax(dim=0).float().clamp(min=EPS)
    factor = activation.clamp(min=EPS) ** alpha / weight_range ** (1 - alpha)
    return factor.clamp(min=EPS)


def quantize_encoder(
    encoder: BertEncoder,
    ranges: dict[str, torch.Tensor],
    *,
    alpha: float = SMOOTHING_ALPHA,
) -> BertEncoder:
    """A copy of `encoder` whose block Linears are `Int8Linear`; the original is untouched.

    Raises:
        KeyError: `ranges` lacks a Linear (it came from another encoder).
    """
    quantised = copy.deepcopy(encoder)
    for index, layer in enumerate(quantised.blocks):
        for attr in _LINEARS:
            linear: nn.Linear = getattr(layer, attr)
            factor = smoothing(ranges[f"{index}.{attr}"], linear.weight.detach(), alpha)
            setattr(layer, attr, Int8Linear(linear, factor))
    return quantised
