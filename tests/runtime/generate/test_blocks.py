"""The KV block pool: reference counts, the prefix cache's hash chain, LRU eviction."""

from __future__ import annotations

import random

import pytest

from fleetserve_runtime.generate.blocks import BlockPool, chain_hash


def test_allocate_and_release_count_references() -> None:
    """Blocks are handed out once each until none is free; released ones come back."""
    pool = BlockPool(4, 16, prefix_caching=False)
    first = pool.allocate(3)
    assert first is not None
    assert len(set(first)) == 3
    assert pool.allocate(2) is None
    assert pool.free_blocks == 1
    assert pool.usage_ratio == pytest.approx(0.75)
    pool.release(first)
    assert pool.free_blocks == 4
    assert all(pool.refs(block) == 0 for block in range(4))


def test_releasing_a_block_twice_is_refused() -> None:
    """A double free is a bookkeeping bug and raises instead of corrupting the counts."""
    pool = BlockPool(2, 4, prefix_caching=False)
    blocks = pool.allocate(1)
    assert blocks is not None
    pool.release(blocks)
    with pytest.raises(ValueError, match="released more often"):
        pool.release(blocks)


def test_chain_hash_depends_on_the_whole_prefix() -> None:
    """Equal blocks after different prefixes hash differently; equal prefixes hash equally."""
    a = chain_hash(b"", [1, 2, 3])
    b = chain_hash(b"", [4, 5, 6])
    assert chain_hash(a, [7, 8, 9]) != chain_hash(b, [7, 8, 9])
    assert chain_hash(a, [7, 8, 9]) == chain_hash(chain_hash(b"", [1, 2, 3]), [7, 8, 9])


def test_registered_blocks_are_shared_and_stay_cached_after_release() -> None:
    """A registered block is found by hash, shared by reference, and kept cached once free."""
    pool = BlockPool(4, 2, prefix_caching=True)
    blocks = pool.allocate(2)
    assert blocks is not None
    h1 = chain_hash(b"", [1, 2])
    h2 = chain_hash(h1, [3, 4])
    pool.register(blocks[0], h1)
    pool.register(blocks[1], h2)
    assert pool.cached_prefix([h1, h2, chain_hash(h2, [5, 6])]) == blocks
    pool.acquire(blocks, query_tokens=5, resumed=False)
    assert [pool.refs(b) for b in blocks] == [2, 2]
    assert (pool.hit_tokens, pool.query_tokens) == (4, 5)
    pool.release(blocks)
    pool.release(blocks)
    assert pool.free_blocks == 4
    assert pool.cached_blocks == 2
    assert pool.cached_prefix([h1, h2]) == blocks
    pool.acquire(blocks[:1], query_tokens=3, resumed=True)
    assert pool.free_blocks == 3
    assert pool.cached_blocks == 1
    # A re-admitted sequence's lookup counts apart: it mostly finds its own blocks again.
    assert (pool.hit_tokens, pool.query_tokens) == (4, 5)
    assert (pool.resumed_hit_tokens, pool.resumed_query_tokens) == (2, 3)


def test_cached_blocks_are_evicted_only_when_no_plain_block_is_left() -> None:
    """Fresh allocations use never-cached blocks first, then evict the least recently freed."""
    pool = BlockPool(3, 1, prefix_caching=True)
    blocks = pool.allocate(2)
    assert blocks is not None
    hashes = [chain_hash(b"", [7]), chain_hash(b"", [8])]
    for block, block_hash in zip(blocks, hashes, strict=True):
        pool.register(block, block_hash)
    pool.release(blocks)
    fresh = pool.allocate(1)
    assert fresh is not None
    assert fresh[0] not in blocks
    assert pool.cached_blocks == 2
    # Release frees a table's tail first, so the tail is the first evicted.
    evicted = pool.allocate(1)
    assert evicted == [blocks[1]]
    assert pool.cached_prefix(hashes[1:]) == []
    assert pool.cached_prefix(hashes[:1]) == [blocks[0]]


def test_a_second_block_with_the_same_prefix_is_not_registered() -> None:
    """Two sequences that computed the same block in one step: the first stays the cached one."""
    pool = BlockPool(2, 1, prefix_caching=True)
    blocks = pool.allocate(2)
    assert blocks is not None
    h = chain_hash(b"", [3])
    pool.register(blocks[0], h)
    pool.register(blocks[1], h)
    pool.release(blocks)
    assert pool.cached_blocks == 1
    assert pool.cached_prefix([h]) == [blocks[0]]


def test_without_prefix_caching_nothing_is_registered_or_found() -> None:
    """`prefix_caching=False` turns register and lookup into no-ops."""
    pool = BlockPool(2, 1, prefix_caching=False)
    blocks = pool.allocate(1)
    assert blocks is not None
    h = chain_hash(b"", [3])
    pool.register(blocks[0], h)
    pool.release(blocks)
    assert pool.cached_prefix([h]) == []
    assert pool.cached_blocks == 0


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_the_counts_consistent(seed: int) -> None:
    """Property: in any order of operations, held + free = all; releasing all frees all."""
    rng = random.Random(seed)
    pool = BlockPool(16, 2, prefix_caching=True)
    tables: list[list[int]] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.4:
            got = pool.allocate(rng.randint(1, 4))
            if got is not None:
                for block in got:
                    if rng.random() < 0.5:
                        pool.register(block, chain_hash(b"", [rng.randint(0, 5)]))
                tables.append(got)
        elif op < 0.7 and tables:
            pool.release(tables.pop(rng.randrange(len(tables))))
        else:
            hashes = [chain_hash(b"", [rng.randint(0, 5)])]
            found = pool.cached_prefix(hashes)
            pool.acquire(found, query_tokens=2, resumed=False)
            if found:
                tables.append(found)
        held = {block for table in tables for block in table}
        refs = sum(len(table) for table in tables)
        assert sum(pool.refs(block) for block in range(16)) == refs
        assert pool.free_blocks == 16 - len(held)
    for table in tables:
        pool.release(table)
    assert pool.free_blocks == 16
    assert all(pool.refs(block) == 0 for block in range(16))
