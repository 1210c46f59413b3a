"""Result cache: LRU by entries and bytes, keys that separate versions and parameters."""

from __future__ import annotations

import numpy as np

from fleetserve_runtime.core.cache import ResultCache, cache_key


def key(instance: str, version: str = "v1", truncate: bool = False) -> bytes:
    return cache_key(model="m", version=version, instance=instance, params={"truncate": truncate})


def test_keys_separate_versions_and_parameters() -> None:
    """A version or a parameter change gives a different key, and so does any input change."""
    assert key("hello") != key("hello", version="v2")
    assert key("hello") != key("hello", truncate=True)
    assert key("hello") != key("  hello ")
    assert key("hello") == key("hello")


def test_lru_evicts_by_entries() -> None:
    """The least recently used entry goes first."""
    cache = ResultCache(max_entries=2, max_bytes=1 << 20)
    cache.put(key("a"), np.zeros(4, dtype=np.float32))
    cache.put(key("b"), np.zeros(4, dtype=np.float32))
    assert cache.get(key("a")) is not None
    cache.put(key("c"), np.zeros(4, dtype=np.float32))
    assert cache.get(key("b")) is None
    assert cache.get(key("a")) is not None
    assert len(cache) == 2


def test_lru_evicts_by_bytes() -> None:
    """Entries are evicted until the byte total fits; an oversized value is not stored."""
    cache = ResultCache(max_entries=100, max_bytes=64)
    cache.put(key("a"), np.zeros(8, dtype=np.float32))
    cache.put(key("b"), np.zeros(8, dtype=np.float32))
    cache.put(key("c"), np.zeros(8, dtype=np.float32))
    assert cache.bytes <= 64
    assert cache.get(key("a")) is None
    cache.put(key("big"), np.zeros(100, dtype=np.float32))
    assert cache.get(key("big")) is None


def test_disabled_cache_stores_nothing() -> None:
    """max_entries=0 turns the cache off."""
    cache = ResultCache(max_entries=0, max_bytes=1 << 20)
    cache.put(key("a"), np.zeros(4))
    assert not cache.enabled
    assert cache.get(key("a")) is None
