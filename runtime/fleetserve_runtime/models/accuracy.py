"""The accuracy guard: a reduced-precision model must embed like its fp32 self, or not load.

At load, a handler serving `bf16` or `int8` embeds `GUARD_TEXTS` twice, with the fp32 weights
it just read and with the reduced-precision model it built from them, and `check` compares
each pair by cosine. The smallest cosine must reach the floor (`precision_min_cosine`, 0.99 by
default), else loading raises `AccuracyError` naming the figure and the worst text's index, and
the version never becomes ready. The figure that passed is kept in the model metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

from fleetserve_runtime.models.base import BatchLayout, CollateContext, ItemError, ModelHandler

__all__ = [
    "GUARD_TEXTS",
    "AccuracyError",
    "AccuracyReport",
    "Precision",
    "PrecisionOptions",
    "check",
    "embed_texts",
]

Precision = Literal["fp32", "bf16", "int8"]

GUARD_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password if I no longer have access to my email?",
    "Quarterly revenue rose 12% year over year, driven by strong demand in Europe.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "The patient presented with a mild fever, dry cough and fatigue lasting three days.",
    "Kubernetes schedules pods onto nodes according to resource requests and affinity rules.",
    "I absolutely loved this movie; the soundtrack alone is worth the ticket.",
    "Terrible service. The food arrived cold and the waiter never came back.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Please find attached the signed contract and the invoice for March.",
    "What is the capital of Australia?",
    "Canberra is the capital city of Australia, not Sydney as many people assume.",
    "The mitochondria is the powerhouse of the cell.",
    "Error: connection refused (ECONNREFUSED) while connecting to 127.0.0.1:5432",
    "She sells seashells by the seashore.",
    "Add two cups of flour, a pinch of salt and stir until the dough is smooth.",
    "The court ruled that the defendant had breached the terms of the lease agreement.",
    "GPU memory usage spikes during the first batch because kernels are compiled lazily.",
    "Hello!",
    "ok",
    "Le chat dort sur le canapé depuis ce matin.",
    "Der Zug nach Berlin hat heute zwanzig Minuten Verspätung.",
    "El mercado abre a las nueve de la mañana todos los días.",
    "Shipping is free for orders over fifty dollars within the continental United States.",
    "Black holes bend spacetime so strongly that not even light can escape their event horizon.",
    "Remember to water the tomatoes every evening during the summer heatwave.",
    "The committee will vote on the proposed budget amendments next Tuesday at 10 am.",
    "Our API returns HTTP 429 when a client exceeds its rate limit; retry after the delay.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
    (
        "Once upon a time, in a kingdom far away, there lived a curious young inventor who "
        "built clocks that could tell the weather, and every morning the villagers gathered "
        "to hear what the day would bring."
    ),
    (
        "Transformers process all tokens of a sequence in parallel using self-attention, "
        "which lets every position attend to every other position, unlike recurrent "
        "networks that read one token at a time."
    ),
    (
        "Why is the sky blue? Rayleigh scattering favours shorter wavelengths, so blue light "
        "is scattered across the sky far more than red."
    ),
)
"""Varied texts (questions, reviews, code, logs, three languages, one to forty words)."""


@dataclass(frozen=True, slots=True)
class PrecisionOptions:
    """The numeric precision a model is served in, and the guard's floor."""

    precision: Precision = "fp32"
    min_cosine: float = 0.99
    """Smallest cosine to the fp32 embeddings a reduced precision may reach on a guard text."""
    min_speedup: float = 1.0
    """Least speed-up over fp32 a reduced precision must show on the guard texts (0: any)."""


@dataclass(frozen=True, slots=True)
class AccuracyReport:
    """How close a reduced-precision model came to fp32 on the guard texts."""

    precision: Precision
    min_cosine: float
    worst_index: int
    """Index into `GUARD_TEXTS` of the text with the smallest cosine."""


class AccuracyError(ValueError):
    """A reduced-precision model strayed too far from fp32; the load is refused."""


class SpeedError(ValueError):
    """A reduced precision ran no faster than fp32 on this device; the load is refused."""


def check_speed(precision: Precision, *, fp32_s: float, reduced_s: float, floor: float) -> float:
    """The speed-up of `precision` over fp32 on the guard texts; `SpeedError` under `floor`.

    CPUs without int8 dot-product instructions (VNNI, AMX) or bf16 ones (`avx512_bf16`,
    AMX) run those precisions through slow generic kernels: measured on an AVX2-only CPU,
    torch's int8 matrix product took 30-50 times as long as fp32's. Such a precision would
    serve correct answers, far slower than the fp32 it was meant to beat.

    Raises:
        SpeedError: the speed-up is under `floor` (a floor of 0 accepts any).
    """
    speedup = fp32_s / max(reduced_s, 1e-9)
    if speedup < floor:
        msg = (
            f"precision {precision} failed the speed guard: the guard texts took "
            f"{reduced_s * 1000:.0f} ms against {fp32_s * 1000:.0f} ms in fp32 "
            f"({speedup:.2f}x, under precision_min_speedup {floor}); this device lacks fast "
            f"{precision} kernels (int8 needs VNNI or AMX, bf16 avx512_bf16 or AMX on a CPU): "
            "serve this model in fp32"
        )
        raise SpeedError(msg)
    return speedup


def check(
    precision: Precision,
    reference: npt.NDArray[np.float32],
    candidate: npt.NDArray[np.float32],
    *,
    floor: float,
) -> AccuracyReport:
    """Compare row by row; `AccuracyError` naming the smallest cosine when under `floor`.

    Raises:
        ValueError: the two sets of embeddings differ in shape.
        AccuracyError: the smallest cosine (or a non-finite one) is under `floor`.
    """
    if reference.shape != candidate.shape:
        msg = f"embeddings of shape {candidate.shape} do not match fp32's {reference.shape}"
        raise ValueError(msg)
    ref = reference.astype(np.float64)
    cand = candidate.astype(np.float64)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cosines = np.nan_to_num((ref * cand).sum(axis=1) / norms, nan=-1.0)
    worst = int(np.argmin(cosines))
    report = AccuracyReport(precision, float(cosines[worst]), worst)
    if report.min_cosine < floor:
        msg = (
            f"precision {precision} failed the accuracy guard: min cosine "
            f"{report.min_cosine:.4f} to fp32, on guard text {worst}, is under the floor "
            f"{floor} (precision_min_cosine); serve this model in fp32 or lower the floor"
        )
        raise AccuracyError(msg)
    return report


class _Allocator:
    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)


def embed_texts(
    handler: ModelHandler, texts: Sequence[str], device: torch.device
) -> npt.NDArray[np.float32]:
    """Embed `texts` as one padded batch through the handler's own pipeline; `[n, dim]`.

    Raises:
        ValueError: the handler failed an item.
    """
    items = [handler.preprocess(text, truncate=True) for text in texts]
    layout = BatchLayout(pad_to=max(item.length for item in items), packed=False)
    batch = handler.collate(items, CollateContext(layout, _Allocator(), device))
    results = handler.postprocess(handler.forward(batch), len(items))
    for result in results:
        if isinstance(result, ItemError):
            msg = f"the accuracy guard's batch failed: {result.message}"
            raise ValueError(msg)
    return np.stack([np.asarray(result, dtype=np.float32) for result in results])
