"""The agreement arithmetic: cosine per vector, exact match and prefix overlap per answer."""

from __future__ import annotations

import math

import pytest

from fleetserve_runtime.core.agreement import (
    compare_texts,
    compare_vectors,
    cosine,
    prefix_overlap,
)


def test_cosine_of_parallel_orthogonal_and_opposite_vectors() -> None:
    assert cosine([1.0, 2.0], [2.0, 4.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 3.0]) == 0.0
    assert cosine([1.0, 0.0], [-1.0, 0.0]) == 0.0
    assert cosine([1.0, 1.0], [1.0, 0.0]) == pytest.approx(1 / math.sqrt(2))


def test_cosine_of_zero_vectors() -> None:
    """Two zero vectors are the same answer; a zero and a non-zero one are not."""
    assert cosine([0.0, 0.0], [0.0, 0.0]) == 1.0
    assert cosine([0.0, 0.0], [0.0, 1.0]) == 0.0


def test_vectors_agree_at_the_threshold() -> None:
    primary = [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
    shadow = [[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]]
    result = compare_vectors(primary, shadow, min_cosine=0.99)
    assert result.compared == 3
    assert result.agreed == 2
    assert result.scores[1] == pytest.approx(1 / math.sqrt(1.01))
    assert compare_vectors(primary, shadow, min_cosine=0.999).agreed == 1


def test_missing_or_misshapen_vectors_score_zero() -> None:
    """A shadow vector that is not there, or of another width, cannot stand in."""
    result = compare_vectors([[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0, 0.0]], min_cosine=0.5)
    assert result.scores == (0.0, 0.0)
    assert result.agreed == 0


def test_prefix_overlap_counts_shared_leading_words_over_the_longer_answer() -> None:
    assert prefix_overlap("a b c d", "a b x d") == pytest.approx(2 / 4)
    assert prefix_overlap("a b", "a b c d") == pytest.approx(2 / 4)
    assert prefix_overlap("x a b", "a b") == 0.0
    assert prefix_overlap("", "") == 1.0
    assert prefix_overlap("a  b\n", "a b") == 1.0


def test_texts_agree_only_when_equal() -> None:
    """Whitespace differences overlap fully but are no exact match."""
    assert compare_texts("a b", "a b").agreed == 1
    different = compare_texts("a  b", "a b")
    assert (different.agreed, different.scores) == (0, (1.0,))
