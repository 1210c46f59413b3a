"""Sampling: greedy, temperature, top-k, top-p, and seeds that do not depend on the batch."""

from __future__ import annotations

from collections import Counter

import torch

from fleetserve_runtime.generate.contracts import SamplingParams
from fleetserve_runtime.generate.sampling import RowSampling, sample

VOCAB = 50


def row(
    temperature: float = 1.0, *, top_k: int = 0, top_p: float = 1.0, seed: int | None = 1
) -> RowSampling:
    params = SamplingParams(
        max_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
    )
    return RowSampling.of(params)


def logits_rows(count: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, VOCAB, generator=generator) * 2


def test_greedy_takes_the_argmax_of_each_row() -> None:
    """Temperature 0 is the most likely token, row by row."""
    logits = logits_rows(4)
    assert sample(logits, [row(0.0) for _ in range(4)]) == logits.argmax(-1).tolist()


def test_a_seed_gives_the_same_tokens_whatever_shares_the_batch() -> None:
    """The seeded row draws the same tokens alone and between other rows of other requests."""
    logits = logits_rows(1, seed=3)
    alone_row = row(0.9, seed=42)
    alone = [sample(logits, [alone_row])[0] for _ in range(30)]
    mixed_row = row(0.9, seed=42)
    others = [row(0.7, seed=None), row(0.0), row(1.3, top_k=5, seed=7)]
    mixed = []
    for step in range(30):
        batch = torch.cat([logits_rows(1, seed=100 + step), logits, logits_rows(2, seed=step)])
        tokens = sample(batch, [others[0], mixed_row, others[1], others[2]])
        mixed.append(tokens[1])
    assert alone == mixed
    assert len(set(alone)) > 1


def test_different_seeds_give_different_draws() -> None:
    """Two seeds over the same logits do not draw the same sequence."""
    logits = logits_rows(1, seed=5)
    first, second = row(1.0, seed=1), row(1.0, seed=2)
    draws_a = [sample(logits, [first])[0] for _ in range(20)]
    draws_b = [sample(logits, [second])[0] for _ in range(20)]
    assert draws_a != draws_b


def test_top_k_draws_only_from_the_k_most_likely() -> None:
    """With top_k=3, every draw is one of the row's three largest logits."""
    logits = logits_rows(1, seed=9)
    allowed = set(logits[0].topk(3).indices.tolist())
    sampler = row(2.0, top_k=3, seed=11)
    draws = {sample(logits, [sampler])[0] for _ in range(200)}
    assert draws <= allowed
    assert len(draws) == 3


def test_top_p_keeps_the_smallest_head_reaching_p() -> None:
    """Nucleus sampling draws only from the most likely tokens whose mass reaches top_p."""
    logits = torch.full((1, VOCAB), -10.0)
    logits[0, 4], logits[0, 8], logits[0, 15] = 3.0, 2.5, 2.0
    probs = torch.softmax(logits[0], -1)
    # The first two hold less than 0.9 together, so the third is needed as well.
    assert probs[4] + probs[8] < 0.9 < probs[4] + probs[8] + probs[15]
    sampler = row(1.0, top_p=0.9, seed=3)
    draws = {sample(logits, [sampler])[0] for _ in range(300)}
    assert draws == {4, 8, 15}
    tight = row(1.0, top_p=0.01, seed=3)
    assert {sample(logits, [tight])[0] for _ in range(50)} == {4}


def test_temperature_sampling_follows_the_softmax() -> None:
    """Draw frequencies match softmax(logits / T) within a loose tolerance."""
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    sampler = row(2.0, seed=5)
    counts = Counter(sample(logits, [sampler])[0] for _ in range(4000))
    expected = torch.softmax(logits[0] / 2.0, -1)
    for token in range(4):
        assert abs(counts[token] / 4000 - float(expected[token])) < 0.03


def test_an_unseeded_request_gets_a_generator_of_its_own() -> None:
    """Two unseeded requests do not share (or replay) one random stream."""
    a, b = row(1.0, seed=None), row(1.0, seed=None)
    assert a.generator is not b.generator
    assert a.generator.initial_seed() != b.generator.initial_seed()
