"""Semantic cache: exact then similar lookups, the threshold, partitions, the bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetserve_runtime.core.semantic_cache import Query, SemanticCache
from fleetserve_runtime.generate.contracts import is_greedy

DIM = 4


def query(
    prompt: str = "p", *, version: str = "v1#1", tenant: str | None = None, max_tokens: int = 8
) -> Query:
    return Query(
        model="m", version=version, tenant=tenant, params={"max_tokens": max_tokens}, prompt=prompt
    )


def unit(angle_deg: float) -> np.ndarray:
    """A vector at `angle_deg` from the x axis: its cosine to `unit(0)` is cos(angle)."""
    angle = math.radians(angle_deg)
    return np.array([math.cos(angle), math.sin(angle), 0.0, 0.0], dtype=np.float32)


def cache(
    *, max_entries: int = 16, max_bytes: int = 1 << 20, min_similarity: float = 0.95
) -> SemanticCache[str]:
    return SemanticCache(
        max_entries=max_entries,
        max_bytes=max_bytes,
        min_similarity=min_similarity,
        size_of=lambda answer: len(answer.encode()),
    )


def test_exact_repeat_hits_exactly_and_other_prompts_do_not() -> None:
    semantic = cache()
    semantic.put(query("hello"), unit(0), "answer")
    hit = semantic.exact(query("hello"))
    assert hit is not None
    assert (hit.value, hit.exact, hit.similarity) == ("answer", True, 1.0)
    assert semantic.exact(query("hello ")) is None


def test_similarity_threshold_is_inclusive_and_a_farther_embedding_misses() -> None:
    """At 0.95, cos 20° ≈ 0.940 misses; cos 15° ≈ 0.966 hits; the best match is returned."""
    semantic = cache(min_similarity=0.95)
    semantic.put(query("a"), unit(0), "zero")
    semantic.put(query("b"), unit(90), "ninety")
    assert semantic.similar(query("c"), unit(20)) is None
    hit = semantic.similar(query("c"), unit(15))
    assert hit is not None
    assert hit.value == "zero"
    assert not hit.exact
    assert hit.similarity == pytest.approx(math.cos(math.radians(15)), abs=1e-6)
    near_ninety = semantic.similar(query("d"), unit(80))
    assert near_ninety is not None
    assert near_ninety.value == "ninety"
    exactly = cache(min_similarity=math.cos(math.radians(15)))
    exactly.put(query("a"), unit(0), "zero")
    assert exactly.similar(query("c"), unit(15)) is not None


def test_embeddings_are_normalised_so_only_direction_counts() -> None:
    semantic = cache()
    semantic.put(query("a"), 10 * unit(0), "zero")
    assert semantic.similar(query("b"), 0.1 * unit(5)) is not None
    assert semantic.similar(query("b"), np.zeros(DIM, dtype=np.float32)) is None


def test_min_similarity_one_means_identical_embeddings() -> None:
    semantic = cache(min_similarity=1.0)
    semantic.put(query("a"), unit(0) * 3, "zero")
    assert semantic.similar(query("b"), unit(0)) is not None
    assert semantic.similar(query("b"), unit(1)) is None


def test_min_similarity_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="min_similarity"):
        cache(min_similarity=0.0)
    with pytest.raises(ValueError, match="min_similarity"):
        cache(min_similarity=1.5)


def test_tenants_never_see_each_others_entries() -> None:
    """Same prompt, same embedding: another tenant (or the untenanted) gets nothing."""
    semantic = cache()
    semantic.put(query("hello", tenant="alice"), unit(0), "alice's")
    for other in ("bob", None, "None"):
        assert semantic.exact(query("hello", tenant=other)) is None
        assert semantic.similar(query("hello", tenant=other), unit(0)) is None
    hit = semantic.similar(query("hi", tenant="alice"), unit(0))
    assert hit is not None
    assert hit.value == "alice's"


def test_a_new_version_or_load_generation_never_serves_an_old_answer() -> None:
    semantic = cache()
    semantic.put(query("hello", version="v1#1"), unit(0), "old")
    for version in ("v2#2", "v1#3"):
        assert semantic.exact(query("hello", version=version)) is None
        assert semantic.similar(query("hello", version=version), unit(0)) is None


def test_parameters_that_shape_the_answer_separate_entries() -> None:
    semantic = cache()
    semantic.put(query("hello", max_tokens=8), unit(0), "eight")
    assert semantic.exact(query("hello", max_tokens=16)) is None
    assert semantic.similar(query("hello", max_tokens=16), unit(0)) is None


def test_byte_bound_counts_embeddings_and_evicts_least_recently_used() -> None:
    """Each entry: 16-byte key + 4-byte answer + 16-byte embedding = 36 bytes."""
    semantic = cache(max_bytes=3 * 36)
    for name, angle in (("a", 0), ("b", 90), ("c", 180)):
        semantic.put(query(name), unit(angle), name * 4)
    assert semantic.bytes == 3 * 36
    assert semantic.exact(query("a")) is not None  # a is now the most recently used
    semantic.put(query("d"), unit(270), "dddd")
    assert len(semantic) == 3
    assert semantic.bytes == 3 * 36
    assert semantic.exact(query("b")) is None
    assert semantic.similar(query("x"), unit(90)) is None  # b's row left with it
    assert semantic.similar(query("x"), unit(0)) is not None
    assert semantic.similar(query("x"), unit(180)) is not None
    assert semantic.similar(query("x"), unit(270)) is not None


def test_entry_bound_evicts_and_a_semantic_hit_counts_as_a_use() -> None:
    semantic = cache(max_entries=2)
    semantic.put(query("a"), unit(0), "a")
    semantic.put(query("b"), unit(90), "b")
    assert semantic.similar(query("x"), unit(2)) is not None  # touches a
    semantic.put(query("c"), unit(180), "c")
    assert semantic.exact(query("a")) is not None
    assert semantic.exact(query("b")) is None


def test_an_answer_larger_than_the_bound_is_not_kept_and_a_zero_cache_keeps_nothing() -> None:
    small = cache(max_bytes=40)
    small.put(query("a"), unit(0), "x" * 100)
    assert len(small) == 0
    assert small.bytes == 0
    off = cache(max_entries=0)
    off.put(query("a"), unit(0), "a")
    assert off.exact(query("a")) is None


def test_replacing_an_entry_keeps_one_row_and_the_bytes_right() -> None:
    semantic = cache()
    semantic.put(query("a"), unit(0), "one")
    semantic.put(query("a"), unit(90), "two")
    assert len(semantic) == 1
    assert semantic.similar(query("x"), unit(0)) is None
    hit = semantic.similar(query("x"), unit(90))
    assert hit is not None
    assert hit.value == "two"
    assert semantic.bytes == 16 + 3 + 16


def test_without_an_embedding_an_entry_answers_exact_repeats_only() -> None:
    semantic = cache()
    semantic.put(query("ids"), None, "by ids")
    assert semantic.exact(query("ids")) is not None
    assert semantic.similar(query("other"), unit(0)) is None


def test_many_entries_grow_and_shrink_the_partition_matrix() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(40, DIM)).astype(np.float32)
    semantic = cache(max_entries=25, min_similarity=0.9999)
    for i, vector in enumerate(vectors):
        semantic.put(query(str(i)), vector, str(i))
    assert len(semantic) == 25
    for i, vector in enumerate(vectors[15:], start=15):
        hit = semantic.similar(query("probe"), vector)
        assert hit is not None
        assert hit.value == str(i)


def test_only_greedy_decoding_is_cacheable() -> None:
    """Sampled requests bypass the cache: temperature 0 is greedy, anything above samples."""
    assert is_greedy(0.0)
    assert not is_greedy(0.7)
    assert not is_greedy(1.0)
