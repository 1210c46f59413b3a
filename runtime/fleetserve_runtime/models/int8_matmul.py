"""The int8 matrix product both int8 paths share: the encoder's `Int8Linear` and the Llama's.

Weights are int8 with one symmetric scale per output channel, quantised once at load;
activations are quantised on the fly with one scale per row (token), so a row's result never
depends on the other rows of its batch. `torch._int_mm` (oneDNN's VNNI kernels on x86)
accumulates in int32 and the product is rescaled to fp32 by both scales. An optional
SmoothQuant factor per input channel (`smooth`) moves part of an outlier channel's range
from the activations into the weights before either is quantised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["EPS", "Int8Weight", "int8_kernel_refusal", "int8_matmul", "quantize_weight"]

EPS = 1e-5
"""Floor of a scale, so an all-zero channel or row divides by something."""


@dataclass(frozen=True, slots=True)
class Int8Weight:
    """A weight matrix stored input-major (`[in, out]`) in int8, with its dequantising scales."""

    values: torch.Tensor
    """`[in, out]` int8."""
    scale: torch.Tensor
    """`[out]` fp32: column `j` of the smoothed weight is `values[:, j] * scale[j]`."""
    inverse_smooth: torch.Tensor | None = None
    """`[in]` fp32 divisor of each input channel, the weight's rows having been multiplied
    by its inverse (None: unsmoothed)."""


def quantize_weight(weight: torch.Tensor, smooth: torch.Tensor | None = None) -> Int8Weight:
    """`[in, out]` weight to int8, each output channel (column) scaled by its largest |value|.

    `smooth` (`[in]`) multiplies each input row first; the product divides the activations
    by it, so `x @ W` is unchanged in exact arithmetic.
    """
    weight = weight.float()
    if smooth is not None:
        weight = weight * smooth[:, None]
    scale = weight.abs().amax(dim=0).clamp(min=EPS) / 127
    values = torch.round(weight / scale).to(torch.int8).contiguous()
    return Int8Weight(values, scale, None if smooth is None else 1 / smooth)


def int8_matmul(x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
    """`x @ W` for fp32 `x` of shape `[rows, in]`: rows quantised one by one; fp32 `[rows, out]`."""
    if weight.inverse_smooth is not None:
        x = x * weight.inverse_smooth
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=EPS) / 127
    quantised = torch.round(x / scale).to(torch.int8)
    product = torch._int_mm(quantised, weight.values)
    return product.to(torch.float32).mul_(scale * weight.scale)


def int8_kernel_refusal(device: torch.device) -> str | None:
    """Why int8 products cannot run on `device` (None: they can).

    Only the CPU is served: on CUDA `torch._int_mm` wants at least 17 rows, which a decode
    step of fewer sequences does not have, and bf16 is the faster choice there anyway. A
    torch build without the CPU kernel raises on a one-row probe.
    """
    if device.type != "cpu":
        return f"int8 products run on the CPU only, not on {device.type}"
    probe = torch.ones(1, 8, dtype=torch.int8)
    try:
        torch._int_mm(probe, probe.t().contiguous())
    except (RuntimeError, AttributeError) as error:
        return f"this torch build has no CPU int8 matrix product ({error})"
    return None
