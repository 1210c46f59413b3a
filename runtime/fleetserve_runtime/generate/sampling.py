"""Next-token choice from a step's logits: greedy, temperature, top-k, top-p, seeded.

One call samples every row of a step at once. Rows that set a logits control first have
their logits adjusted (`adjust_logits`, batched over those rows alone, in vLLM's order and
with its semantics): `logit_bias`, `min_tokens` (end-of-sequence and stop token ids masked
until that many tokens), the repetition, frequency and presence penalties, then `min_p`.
Rows that set none skip all of it: a batch without controls takes the same path as before
them. Rows held to a grammar (structured output, `generate.grammar`) then have every token
it forbids masked to -inf, after the controls, so no control can bring one back. Greedy
rows (temperature 0) take the argmax.
The others are scaled by their temperature, cut to their top-k and top-p (nucleus) sets and
drawn by inverse transform sampling with one uniform number from the request's own
`torch.Generator`: a request draws exactly one number per token from a generator nobody else
touches, so a seeded request gives the same output whatever else shares its steps.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from fleetserve_runtime.generate.contracts import SamplingParams, is_greedy
from fleetserve_runtime.generate.grammar import GrammarState, mask_logits

__all__ = ["RowSampling", "TokenHistory", "adjust_logits", "sample"]


class TokenHistory(Protocol):
    """A sequence's tokens so far (the prompt's, then the generated ones): what penalties see."""

    @property
    def tokens(self) -> Sequence[int]:
        """The prompt followed by the tokens generated so far."""
        ...

    @property
    def prompt_len(self) -> int:
        """How many of `tokens` are the prompt's."""
        ...


@dataclass(slots=True, eq=False)
class RowSampling:
    """How one request samples: its parameters and its private random stream."""

    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_p: float = 0.0
    min_tokens: int = 0
    held_back: tuple[int, ...] = ()
    """Token ids masked while fewer than `min_tokens` were generated: end-of-sequence
    (unless ignored) and the stop token ids."""
    grammar: GrammarState | None = None
    """The sequence's place in its output grammar; None: the output is free."""

    @classmethod
    def of(
        cls,
        params: SamplingParams,
        eos_token_ids: Collection[int] = (),
        grammar: GrammarState | None = None,
    ) -> RowSampling:
        """The sampling of a request; an unseeded one gets a random seed of its own.

        `grammar` is the sequence's own state of `params.grammar`, compiled by the caller.
        """
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        generator = torch.Generator()
        generator.manual_seed(seed)
        eos = () if params.ignore_eos else tuple(sorted(eos_token_ids))
        return cls(
            params.temperature,
            params.top_k,
            params.top_p,
            generator,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            repetition_penalty=params.repetition_penalty,
            logit_bias=params.logit_bias,
            min_p=params.min_p,
            min_tokens=params.min_tokens,
            held_back=tuple(dict.fromkeys((*eos, *params.stop_token_ids))),
            grammar=grammar,
        )

    @property
    def greedy(self) -> bool:
        """Temperature 0: always the most likely token."""
        return is_greedy(self.temperature)

    @property
    def cuts(self) -> bool:
        """Top-k or top-p narrow the distribution (which needs the sorted probabilities)."""
        return self.top_k > 0 or self.top_p < 1.0

    @property
    def penalises(self) -> bool:
        """A repetition, frequency or presence penalty is set (which needs the history)."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def adjusts(self) -> bool:
        """Some logits control is set: the row goes through `adjust_logits`."""
        return (
            self.penalises
            or bool(self.logit_bias)
            or (self.min_tokens > 0 and bool(self.held_back))
            or (self.min_p > 0.0 and not self.greedy)
        )


def sample(
    logits: torch.Tensor,
    rows: Sequence[RowSampling],
    histories: Sequence[TokenHistory] | None = None,
) -> list[int]:
    """One token id per row of `logits` `[len(rows), vocab]`, each as its `rows` entry says.

    `histories` (one per row) are the sequences' tokens so far, which penalties and
    `min_tokens` need; None counts as no tokens yet.
    """
    adjusted = [n for n, row in enumerate(rows) if row.adjusts]
    if adjusted:
        seen: Sequence[TokenHistory] = histories or [_NoHistory()] * len(rows)
        new_rows = adjust_logits(
            logits[adjusted], [rows[n] for n in adjusted], [seen[n] for n in adjusted]
        )
        index = torch.tensor(adjusted, device=logits.device)
        logits = logits.float().index_put((index,), new_rows)
    constrained = [n for n, row in enumerate(rows) if row.grammar is not None]
    if constrained:
        states = [row.grammar for row in rows if row.grammar is not None]
        logits = mask_logits(logits, constrained, states)
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


@dataclass(frozen=True, slots=True)
class _NoHistory:
    """The history of a row sampled without one: nothing yet."""

    tokens: tuple[int, ...] = ()
    prompt_len: int = 0


def adjust_logits(
    logits: torch.Tensor, rows: Sequence[RowSampling], histories: Sequence[TokenHistory]
) -> torch.Tensor:
    """The logits `[len(rows), vocab]` after each row's controls, as new float32 rows.

    In vLLM's order: `logit_bias` added; the `held_back` ids masked while fewer than
    `min_tokens` were generated; the repetition penalty over the prompt's and the
    generated tokens (a positive logit divided by it, a negative one multiplied); the
    frequency penalty times each token's count among the generated tokens and the
    presence penalty once per generated token subtracted; then, on rows that sample,
    `min_p` drops every token whose probability at the row's temperature is below
    `min_p` times the most likely one's. A control a row does not set leaves it as it is.
    """
    out = logits.to(torch.float32, copy=True)
    vocab = out.shape[-1]
    generated = [history.tokens[history.prompt_len :] for history in histories]
    if any(row.logit_bias for row in rows):
        pairs = [row.logit_bias for row in rows]
        ids = _padded([[token for token, _ in bias] for bias in pairs], vocab, out.device)
        values = _padded_values([[value for _, value in bias] for bias in pairs], ids)
        out += _scatter(ids, values, vocab)
    early = [
        row.held_back if len(done) < row.min_tokens else ()
        for row, done in zip(rows, generated, strict=True)
    ]
    if any(early):
        ids = _padded([list(held) for held in early], vocab, out.device)
        out.masked_fill_(_scatter(ids, torch.ones_like(ids, dtype=out.dtype), vocab) > 0, -math.inf)
    if any(row.penalises for row in rows):
        counts = _counts(generated, vocab, out.device)
        if any(row.repetition_penalty != 1.0 for row in rows):
            prompts = [history.tokens[: history.prompt_len] for history in histories]
            seen = (counts > 0) | (_counts(prompts, vocab, out.device) > 0)
            penalty = _column([row.repetition_penalty for row in rows], out)
            out = torch.where(seen, torch.where(out > 0, out / penalty, out * penalty), out)
        out -= _column([row.frequency_penalty for row in rows], out) * counts
        out -= _column([row.presence_penalty for row in rows], out) * (counts > 0)
    floors = [row.min_p if not row.greedy else 0.0 for row in rows]
    if any(floors):
        temperatures = _column([row.temperature if not row.greedy else 1.0 for row in rows], out)
        # p / p_max >= min_p  <=>  logit >= max logit + temperature * log(min_p)
        floor = out.amax(dim=-1, keepdim=True) + temperatures * torch.log(_column(floors, out))
        out.masked_fill_(out < floor, -math.inf)
    return out


def _column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]


def _padded(rows: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Token ids `[len(rows), longest]`, short rows padded with `vocab` (a column past the end)."""
    width = max((len(row) for row in rows), default=0)
    padded = [[*row, *([vocab] * (width - len(row)))] for row in rows]
    return torch.tensor(padded, dtype=torch.long, device=device).reshape(len(rows), width)


def _padded_values(rows: Sequence[Sequence[float]], ids: torch.Tensor) -> torch.Tensor:
    width = ids.shape[-1]
    padded = [[*row, *([0.0] * (width - len(row)))] for row in rows]
    return torch.tensor(padded, dtype=torch.float32, device=ids.device).reshape(ids.shape)


def _scatter(ids: torch.Tensor, values: torch.Tensor, vocab: int) -> torch.Tensor:
    """`[rows, vocab]` sums of `values` at `ids` (padding, at column `vocab`, dropped)."""
    total = torch.zeros(ids.shape[0], vocab + 1, dtype=values.dtype, device=ids.device)
    return total.scatter_add_(1, ids, values)[:, :vocab]


def _counts(rows: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """How often each token id occurs in each row, `[len(rows), vocab]` float32."""
    ids = _padded(rows, vocab, device)
    return _scatter(ids, torch.ones(ids.shape, dtype=torch.float32, device=device), vocab)
