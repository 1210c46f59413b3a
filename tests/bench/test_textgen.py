"""The benchmark's synthetic texts follow the protocol's length quantiles (bench/textgen.py)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from bench.textgen import (
    MS_MARCO_QUERIES,
    PROFILES,
    QUANTILE_LEVELS,
    SST_SENTENCES,
    LengthQuantiles,
    generate_workload,
)

#: Large enough that sampling noise stays well under one token at P99.
SAMPLE_SIZE = 20_000


def _quantile(values: Sequence[int], level: float) -> int:
    """Return the nearest-rank quantile of ``values`` at ``level`` in (0, 1]."""
    ordered = sorted(values)
    return ordered[max(round(level * len(ordered)) - 1, 0)]


@pytest.mark.parametrize(
    ("profile", "table"),
    [
        pytest.param("short", MS_MARCO_QUERIES, id="short-msmarco"),
        pytest.param("medium", SST_SENTENCES, id="medium-sst"),
    ],
)
def test_single_profiles_hit_every_quantile(profile: str, table: LengthQuantiles) -> None:
    """Each pure profile reproduces its P5 … P100 table within one token."""
    lengths = PROFILES[profile].sample(SAMPLE_SIZE, random.Random(0))
    for level, expected in zip(QUANTILE_LEVELS, table.tokens, strict=True):
        assert abs(_quantile(lengths, level) - expected) <= 1, f"P{level * 100:g}"
    assert max(lengths) <= table.tokens[-1]


def test_mixed_workload_matches_the_protocols_mix() -> None:
    """Generated texts measure, with the model's tokenizer, the protocol's 70/30 mix figures."""
    workload = generate_workload(PROFILES["mixed"], SAMPLE_SIZE, seed=0)
    published = {0.50: 10, 0.80: 20, 0.95: 36, 0.99: 49, 1.00: 80}
    for level, expected in published.items():
        # Two tokens: the mix's published figures come from the real corpora, ours from the
        # interpolated quantile tables, which differ slightly in the sparse sentence tail.
        assert abs(_quantile(workload.token_counts, level) - expected) <= 2, f"P{level * 100:g}"


def test_generation_is_seeded() -> None:
    """The same seed gives the same texts; another seed gives other texts."""
    first = generate_workload(PROFILES["mixed"], 200, seed=7)
    assert first == generate_workload(PROFILES["mixed"], 200, seed=7)
    assert first.texts != generate_workload(PROFILES["mixed"], 200, seed=8).texts


def test_quantile_interpolation_rounds_between_table_points() -> None:
    """Lengths interpolate linearly between quantiles and start at one word at P0."""
    assert MS_MARCO_QUERIES.length_at(0.0) == 3
    assert MS_MARCO_QUERIES.length_at(0.45) in {8, 9}
    assert MS_MARCO_QUERIES.length_at(1.0) == 44


def test_bad_quantile_tables_are_rejected() -> None:
    """An unsorted table, or one of the wrong size, is refused."""
    with pytest.raises(ValueError, match="sorted"):
        LengthQuantiles("bad", (9, 8, *MS_MARCO_QUERIES.tokens[2:]))
    with pytest.raises(ValueError, match="quantiles"):
        LengthQuantiles("bad", (5, 6))
