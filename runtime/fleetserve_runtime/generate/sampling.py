"""Next-token choice from a step's logits: greedy, temperature, top-k, top-p, seeded.

One call samples every row of a step at once. Greedy rows (temperature 0) take the argmax.
The others are scaled by their temperature, cut to their top-k and top-p (nucleus) sets and
drawn by inverse transform sampling with one uniform number from the request's own
`torch.Generator`: a request draws exactly one number per token from a generator nobody else
touches, so a seeded request gives the same output whatever else shares its steps.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fleetserve_runtime.generate.contracts import SamplingParams

__all__ = ["RowSampling", "sample"]


@dataclass(slots=True, eq=False)
class RowSampling:
    """How one request samples: its parameters and its private random stream."""

    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator

    @classmethod
    def of(cls, params: SamplingParams) -> RowSampling:
        """The sampling of a request; an unseeded one gets a random seed of its own."""
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        generator = torch.Generator()
        generator.manual_seed(seed)
        return cls(params.temperature, params.top_k, params.top_p, generator)

    @property
    def greedy(self) -> bool:
        """Temperature 0: always the most likely token."""
        return self.temperature <= 0.0

    @property
    def cuts(self) -> bool:
        """Top-k or top-p narrow the distribution (which needs the sorted probabilities)."""
        return self.top_k > 0 or self.top_p < 1.0


def sample(logits: torch.Tensor, rows: Sequence[RowSampling]) -> list[int]:
    """One token id per row of `logits` `[len(rows), vocab]`, each as its `rows` entry says."""
    tokens = torch.argmax(logits, dim=-1)
    plain = [n for n, row in enumerate(rows) if not row.greedy and not row.cuts]
    cut = [n for n, row in enumerate(rows) if not row.greedy and row.cuts]
    if plain:
        tokens[plain] = _draw_plain(logits[plain], [rows[n] for n in plain])
    if cut:
        tokens[cut] = _draw_cut(logits[cut], [rows[n] for n in cut])
    return [int(token) for token in tokens.tolist()]


CANDIDATES = 64
"""Top-k / top-p rows first look at this many most likely tokens (a partial sort): a full
sort of a 50k vocabulary costs more than a small model's whole step on one core. Only a row
whose nucleus reaches past them (a very flat distribution) is sorted in full."""


def _uniforms(rows: Sequence[RowSampling], device: torch.device) -> torch.Tensor:
    draws = torch.cat([torch.rand(1, generator=row.generator) for row in rows])
    return draws.to(device=device)


def _temperatures(rows: Sequence[RowSampling], like: torch.Tensor) -> torch.Tensor:
    values = [row.temperature for row in rows]
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]


def _pick(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse transform: the first index whose cumulative weight passes the draw's share."""
    cumulative = torch.cumsum(weights, dim=-1)
    targets = (uniforms * cumulative[:, -1])[:, None]
    picked = torch.searchsorted(cumulative, targets, right=True)[:, 0]
    return picked.clamp_(max=weights.shape[-1] - 1)


def _draw_plain(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    logits = logits.float()
    # One new tensor, then in place: on a 50k vocabulary each pass costs a few ms on CPU.
    weights = logits - logits.amax(dim=-1, keepdim=True)
    weights.div_(_temperatures(rows, logits)).exp_()
    return _pick(weights, _uniforms(rows, logits.device))


def _draw_cut(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    scaled = logits.float() / _temperatures(rows, logits.float())
    vocab = scaled.shape[-1]
    top_k = [row.top_k if 0 < row.top_k < vocab else vocab for row in rows]
    width = min(vocab, max([CANDIDATES, *(k for k in top_k if k < vocab)]))
    values, order = torch.topk(scaled, width, dim=-1)
    limits = torch.tensor(top_k, device=scaled.device)[:, None]
    ranks = torch.arange(width, device=scaled.device)[None, :]
    values = values.masked_fill(ranks >= limits, float("-inf"))
    # Probabilities over the row's top-k (renormalised), or over the whole vocabulary.
    cut = torch.tensor([k < vocab for k in top_k], device=scaled.device)
    norm = torch.where(cut, values.logsumexp(dim=-1), scaled.logsumexp(dim=-1))
    probs = torch.exp(values - norm[:, None])
    top_p = torch.tensor([row.top_p for row in rows], device=scaled.device)[:, None]
    mass = probs.sum(dim=-1)
    # Keep the smallest head whose mass reaches top_p: a token stays while the mass before
    # it is still short of top_p (so the most likely token always stays).
    before = torch.cumsum(probs, dim=-1) - probs
    probs = probs.masked_fill(before >= top_p, 0.0)
    uniforms = _uniforms(rows, logits.device)
    picked = order.gather(-1, _pick(probs, uniforms)[:, None])[:, 0]
    short = (~cut & (mass < top_p[:, 0])).nonzero()[:, 0].tolist()
    if short and width < vocab:
        picked[short] = _draw_sorted(scaled[short], top_p[short], uniforms[short])
    return picked


def _draw_sorted(scaled: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Top-p over fully sorted rows, for nuclei wider than the candidates (same draws)."""
    ordered, order = torch.sort(scaled, dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    probs = probs.masked_fill(torch.cumsum(probs, dim=-1) - probs >= top_p, 0.0)
    return order.gather(-1, _pick(probs, uniforms)[:, None])[:, 0]
