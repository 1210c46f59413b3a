"""How closely a shadow version's answer agrees with the serving version's: pure arithmetic.

The serving pod mirrors a sample of its requests to the version a rollout is about to
canary (`server.shadow`) and compares the two answers here. One *comparison unit* is one
embedding vector (a request for 8 texts gives 8 units) or one generated answer.

- **Embeddings**: the cosine similarity of the two vectors, a·b / (|a| |b|); two zero
  vectors are similar (1.0), a zero and a non-zero vector are not (0.0). A unit *agrees*
  when its similarity is at least `min_cosine`. A vector the shadow did not return (fewer
  rows, another dimension) is a unit at similarity 0: the shadow's answer cannot stand in
  for the primary's.
- **Generated text** (greedy requests only: sampled answers differ by design): a unit
  agrees when the two texts are *exactly* equal, the only agreement greedy decoding
  promises. How far they went together is the *prefix overlap*: the words (runs of
  non-whitespace) the two answers share from their start, divided by the longer answer's
  word count (two empty answers: 1.0). Greedy decoding conditions every token on the ones
  before it, so once two answers part they rarely meet again: the shared prefix is what
  the two versions agree on, and a token F1 would reward a reordered answer.

Both return a `Comparison`: one score per unit (for the similarity histogram) and how many
units agreed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Comparison", "compare_texts", "compare_vectors", "cosine", "prefix_overlap"]


@dataclass(frozen=True, slots=True)
class Comparison:
    """The scores of the compared units (similarity or overlap, in [0, 1]) and the agreements."""

    scores: tuple[float, ...]
    agreed: int

    @property
    def compared(self) -> int:
        """How many units were compared."""
        return len(self.scores)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors of one length, clipped to [0, 1].

    A negative cosine is as far from agreement as an orthogonal one: both count 0.
    """
    left = np.asarray(a, dtype=np.float64)
    right = np.asarray(b, dtype=np.float64)
    norms = float(np.linalg.norm(left) * np.linalg.norm(right))
    if norms == 0.0:
        return 1.0 if not left.any() and not right.any() else 0.0
    return min(max(float(left @ right) / norms, 0.0), 1.0)


def compare_vectors(
    primary: Sequence[Sequence[float]], shadow: Sequence[Sequence[float]], min_cosine: float
) -> Comparison:
    """Each primary vector against the shadow's of the same index; a missing one scores 0."""
    scores = []
    for index, vector in enumerate(primary):
        other = shadow[index] if index < len(shadow) else None
        same_length = other is not None and len(other) == len(vector)
        scores.append(cosine(vector, other) if same_length and other is not None else 0.0)
    agreed = sum(1 for score in scores if score >= min_cosine)
    return Comparison(tuple(scores), agreed)


def prefix_overlap(a: str, b: str) -> float:
    """The words two texts share from their start over the longer one's words (1.0: both empty)."""
    left, right = a.split(), b.split()
    longest = max(len(left), len(right))
    if longest == 0:
        return 1.0
    shared = 0
    for x, y in zip(left, right, strict=False):
        if x != y:
            break
        shared += 1
    return shared / longest


def compare_texts(primary: str, shadow: str) -> Comparison:
    """One generated answer: agreed when equal, scored by its prefix overlap."""
    return Comparison((prefix_overlap(primary, shadow),), int(primary == shadow))
