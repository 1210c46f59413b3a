"""Logits controls (penalties, `logit_bias`, `min_p`, `min_tokens`) against a plain reference.

`adjust_logits` works batched over padded tensors; the reference here walks one row and one
token at a time, as the semantics (vLLM's) are written down, so each control is checked
alone and all together on random logits and random histories.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from fleetserve_runtime.generate import sampling
from fleetserve_runtime.generate.contracts import SamplingParams
from fleetserve_runtime.generate.sampling import RowSampling, adjust_logits, sample

VOCAB = 40
EOS = 3


@dataclass(frozen=True)
class History:
    """A sequence's tokens, as `Seq` holds them."""

    tokens: tuple[int, ...]
    prompt_len: int


def row(**controls: Any) -> RowSampling:
    params = SamplingParams(max_tokens=8, **{"seed": 1, **controls})
    return RowSampling.of(params, eos_token_ids={EOS})


def reference(logits: torch.Tensor, row: RowSampling, history: History) -> torch.Tensor:
    """One row's logits after its controls, token by token."""
    out = logits.clone().float()
    generated = list(history.tokens[history.prompt_len :])
    for token, bias in row.logit_bias:
        out[token] += bias
    if len(generated) < row.min_tokens:
        for token in row.held_back:
            out[token] = -math.inf
    for token in set(history.tokens):
        value = float(out[token])
        penalty = row.repetition_penalty
        out[token] = value / penalty if value > 0 else value * penalty
    for token in set(generated):
        out[token] -= row.frequency_penalty * generated.count(token) + row.presence_penalty
    if row.min_p > 0 and not row.greedy:
        probs = torch.softmax(out / row.temperature, dim=-1)
        out[probs < row.min_p * probs.max()] = -math.inf
    return out


def random_history(generator: torch.Generator) -> History:
    prompt = torch.randint(0, VOCAB, (int(torch.randint(1, 12, (1,), generator=generator)),))
    output = torch.randint(0, VOCAB, (int(torch.randint(0, 12, (1,), generator=generator)),))
    return History(tuple(prompt.tolist() + output.tolist()), len(prompt))


CONTROLS = [
    pytest.param({"presence_penalty": 1.5}, id="presence_penalty"),
    pytest.param({"presence_penalty": -1.0}, id="negative-presence_penalty"),
    pytest.param({"frequency_penalty": 0.7}, id="frequency_penalty"),
    pytest.param({"repetition_penalty": 1.8}, id="repetition_penalty"),
    pytest.param({"repetition_penalty": 0.5}, id="repetition_penalty-under-1"),
    pytest.param({"logit_bias": ((5, 8.0), (7, -100.0), (EOS, 3.5))}, id="logit_bias"),
    pytest.param({"min_p": 0.2, "temperature": 0.8}, id="min_p"),
    pytest.param({"min_tokens": 50, "stop_token_ids": (9, 11)}, id="min_tokens"),
]


@pytest.mark.parametrize("controls", CONTROLS)
def test_each_control_matches_the_reference(controls: dict[str, Any]) -> None:
    """Alone on a row, each control changes the logits, exactly as the reference does."""
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(6, VOCAB, generator=generator) * 3
    histories = [random_history(generator) for _ in range(6)]
    rows = [row(**controls) for _ in range(6)]
    adjusted = adjust_logits(logits, rows, histories)
    expected = torch.stack([reference(logits[n], rows[n], histories[n]) for n in range(6)])
    torch.testing.assert_close(adjusted, expected)
    assert not torch.equal(adjusted, logits)


def test_mixed_controls_in_one_batch_match_the_reference() -> None:
    """Rows with different controls (and none) side by side: each as if alone."""
    generator = torch.Generator().manual_seed(3)
    rows = [
        row(presence_penalty=0.5, frequency_penalty=-0.3, temperature=0.7, min_p=0.05),
        row(),
        row(repetition_penalty=1.3, logit_bias=((1, 2.0),)),
        row(min_tokens=2, temperature=0.0, min_p=0.9),
        row(ignore_eos=True, min_tokens=100, frequency_penalty=2.0),
    ]
    logits = torch.randn(len(rows), VOCAB, generator=generator) * 2
    histories = [random_history(generator) for _ in rows]
    adjusted = adjust_logits(logits, rows, histories)
    expected = torch.stack([reference(logits[n], r, histories[n]) for n, r in enumerate(rows)])
    torch.testing.assert_close(adjusted, expected)
    torch.testing.assert_close(adjusted[1], logits[1])


def test_min_tokens_masks_eos_and_stop_token_ids_until_reached() -> None:
    """Greedy on logits that favour EOS: a stop token id, then EOS only once min_tokens pass."""
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS], logits[0, 9], logits[0, 20] = 10.0, 9.0, 1.0
    early = History((30, 31, 32), 2)
    done = History((30, 31, 32, 33), 2)
    masked = row(temperature=0.0, min_tokens=2, stop_token_ids=(9,))
    assert sample(logits, [masked], [early]) == [20]
    assert sample(logits, [masked], [done]) == [EOS]
    ignored = row(temperature=0.0, min_tokens=2, ignore_eos=True)
    assert sample(logits, [ignored], [early]) == [EOS]


def test_penalties_and_bias_steer_greedy_choices() -> None:
    """Greedy picks the argmax of the adjusted logits, not of the raw ones."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 4], logits[0, 6] = 5.0, 4.0
    history = History((1, 4), 1)
    assert sample(logits, [row(temperature=0.0)], [history]) == [4]
    assert sample(logits, [row(temperature=0.0, presence_penalty=1.5)], [history]) == [6]
    assert sample(logits, [row(temperature=0.0, frequency_penalty=1.5)], [history]) == [6]
    assert sample(logits, [row(temperature=0.0, repetition_penalty=1.5)], [history]) == [6]
    assert sample(logits, [row(temperature=0.0, logit_bias=((30, 6.0),))], [history]) == [30]


def test_min_p_draws_only_tokens_near_the_most_likely() -> None:
    """With min_p, tokens under the floor are never drawn; without it they are."""
    logits = torch.zeros(1, VOCAB)
    logits[0, :3] = torch.tensor([2.0, 1.9, 1.8])
    history = History((1,), 1)
    free = row(temperature=1.0, seed=None)
    floored = row(temperature=1.0, min_p=0.5, seed=None)
    drawn_free = {sample(logits, [free], [history])[0] for _ in range(200)}
    drawn_floored = {sample(logits, [floored], [history])[0] for _ in range(200)}
    assert drawn_floored == {0, 1, 2}
    assert len(drawn_free) > 3


def test_rows_without_controls_skip_the_adjustment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that sets no control never builds the controls' tensors (the fast path)."""

    def fail(*_: object) -> torch.Tensor:
        raise AssertionError("adjust_logits ran for rows without controls")

    monkeypatch.setattr(sampling, "adjust_logits", fail)
    logits = torch.randn(3, VOCAB)
    rows = [row(temperature=0.0), row(temperature=0.9, top_k=5), row(min_p=0.3, temperature=0.0)]
    assert sample(logits, rows)[0] == int(logits[0].argmax())
