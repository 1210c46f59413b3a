"""`generation.dtype: int8` for a Llama on CPU: calibrate, quantise, and guard the result.

The fp32 model is built first. Its activations on `quantize.CALIBRATION_TEXTS` set a
SmoothQuant factor (alpha `SMOOTHING_ALPHA`) per input channel of every projection, as the
encoder's int8 does; `LlamaModel.with_int8_weights` then makes the int8 copy. Without
smoothing, the outlier channels a Llama's RMSNorm outputs carry cost SmolLM2 a sixth of its
greedy choices (top-1 agreement 0.84 with fp32 on the guard texts).

The guard: both models score every position of `accuracy.GUARD_TEXTS` (texts the calibration
never saw) and the int8 one must pick fp32's top token on at least `MIN_TOP1_AGREEMENT` of
them, and stray by at most `MAX_LOGIT_ERROR` on any logit; else loading raises
`AccuracyError` naming the setting, and the version never becomes ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fleetserve_runtime.models.accuracy import GUARD_TEXTS, AccuracyError
from fleetserve_runtime.models.causal_lm import SeqChunk, StepInput, TextCodec
from fleetserve_runtime.models.int8_matmul import int8_kernel_refusal
from fleetserve_runtime.models.llama.model import LlamaModel, Projection
from fleetserve_runtime.models.quantize import CALIBRATION_TEXTS, smoothing

__all__ = [
    "MAX_LOGIT_ERROR",
    "MIN_TOP1_AGREEMENT",
    "SETTING",
    "SMOOTHING_ALPHA",
    "LogitsReport",
    "check_logits",
    "int8_model",
    "probe_logits",
]

SETTING = "generation.dtype int8"
"""What a refusal names: the setting that asked for int8."""

SMOOTHING_ALPHA = 0.5
"""SmoothQuant's alpha; of 0.5, 0.65 and 0.8, 0.5 kept SmolLM2 closest to fp32."""

MIN_TOP1_AGREEMENT = 0.85
"""Least share of guard-text positions where int8's top token is fp32's. SmolLM2 in int8
measured 0.876-0.883 (bf16: 0.973); a wrong scale or unsmoothed outliers fall under it."""

MAX_LOGIT_ERROR = 12.0
"""Largest |int8 - fp32| allowed on any logit of the guard texts (SmolLM2's reach about 40).
SmolLM2 in int8 measured 5.9 with two torch threads and 8.1 with one (a maximum over 34
million logits moves with the fp32 reference's summation order; bf16: 2.3)."""

_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class LogitsReport:
    """How close the int8 model came to fp32 on the guard texts."""

    top1_agreement: float
    max_logit_error: float


def int8_model(
    reference: LlamaModel, codec: TextCodec, device: torch.device
) -> tuple[LlamaModel, LogitsReport]:
    """The int8 copy of fp32 `reference`, once it has passed the guard, and its figures.

    Raises:
        ValueError: int8 products cannot run on `device`.
        AccuracyError: the int8 model strayed past a bound on the guard texts.
    """
    refusal = int8_kernel_refusal(device)
    if refusal is not None:
        msg = f"{SETTING} is not available here: {refusal}; use float32 or bfloat16"
        raise ValueError(msg)
    reach = reference.config.max_position_embeddings
    ranges = _activation_ranges(reference, _encode(codec, CALIBRATION_TEXTS, reach))

    def smooth(weight: torch.Tensor) -> torch.Tensor:
        return smoothing(ranges[id(weight)], weight.t(), SMOOTHING_ALPHA)

    candidate = reference.with_int8_weights(smooth)
    guard = _encode(codec, GUARD_TEXTS, reach)
    report = check_logits(probe_logits(reference, guard), probe_logits(candidate, guard))
    return candidate, report


def probe_logits(model: LlamaModel, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Logits of every position of every prompt, `[positions, vocab]`; reallocates the pool."""
    longest = max(len(prompt) for prompt in prompts)
    blocks = -(-longest // _BLOCK_SIZE)
    model.allocate_cache(blocks, _BLOCK_SIZE)
    rows = []
    for prompt in prompts:
        chunk = SeqChunk(prompt, 0, list(range(blocks)), all_logits=True)
        rows.append(model.forward(StepInput([chunk])))
    model.release_cache()
    return torch.cat(rows)


def check_logits(reference: torch.Tensor, candidate: torch.Tensor) -> LogitsReport:
    """Compare int8 logits to fp32's; `AccuracyError` naming the setting past a bound.

    Raises:
        AccuracyError: top-1 agreement under `MIN_TOP1_AGREEMENT`, or a logit error over
            `MAX_LOGIT_ERROR` (or not finite).
    """
    agreement = (reference.argmax(-1) == candidate.argmax(-1)).float().mean().item()
    error = (reference - candidate).abs().max().item()
    report = LogitsReport(agreement, error)
    if agreement < MIN_TOP1_AGREEMENT or not error <= MAX_LOGIT_ERROR:
        msg = (
            f"{SETTING} failed the accuracy guard: on the guard texts its top token was "
            f"fp32's at {agreement:.3f} of positions (floor {MIN_TOP1_AGREEMENT}) and its "
            f"largest logit error {error:.2f} (bound {MAX_LOGIT_ERROR}); serve this model "
            "in float32 or bfloat16"
        )
        raise AccuracyError(msg)
    return report


def _activation_ranges(
    model: LlamaModel, prompts: Sequence[Sequence[int]]
) -> dict[int, torch.Tensor]:
    """Largest |input| of each input channel of every projection, keyed by the weight's id."""
    ranges: dict[int, torch.Tensor] = {}

    def record(weight: Projection, x: torch.Tensor) -> None:
        seen = x.abs().amax(dim=0)
        key = id(weight)
        ranges[key] = torch.maximum(ranges[key], seen) if key in ranges else seen

    model.observe(record)
    try:
        probe_logits(model, prompts)
    finally:
        model.observe(None)
    return ranges


def _encode(codec: TextCodec, texts: Sequence[str], reach: int) -> list[list[int]]:
    """Token ids of each text, cut at the model's `reach` in positions."""
    return [codec.encode(text, add_special=True)[:reach] for text in texts]
