"""A sequence's blocks: starting from a cached prefix, growing, registering once, freeing."""

from __future__ import annotations

from fleetserve_runtime.generate.blocks import BlockPool
from fleetserve_runtime.generate.kv_manager import KVManager
from fleetserve_runtime.generate.sequence import Seq


def computed(kv: KVManager, seq: Seq, tokens: int) -> None:
    """Blocks for `tokens` more tokens, as a step that computed them would leave `seq`."""
    kv.grow(seq, kv.blocks_for(seq.num_computed + tokens) - len(seq.block_table))
    seq.num_computed += tokens
    kv.cache_computed(seq)


def computed_and_freed(kv: KVManager, tokens: int) -> Seq:
    """A sequence of `tokens` prompt tokens, started cold, computed whole, then freed."""
    seq = Seq(0, list(range(tokens)), tokens)
    kv.start(seq, [])
    computed(kv, seq, tokens)
    kv.free(seq)
    return seq


def test_a_sequence_reuses_the_full_blocks_another_computed() -> None:
    """The cached prefix stops before the last token, which must be computed to sample."""
    kv = KVManager(BlockPool(16, 4, prefix_caching=True))
    first = Seq(0, list(range(10)), 10)
    kv.start(first, kv.cached_prefix(first))
    computed(kv, first, 10)
    assert first.cached_tokens == 0
    second = Seq(1, list(range(8)), 8)
    prefix = kv.cached_prefix(second)
    assert prefix == first.block_table[:1]
    kv.start(second, prefix)
    assert (second.num_computed, second.cached_tokens) == (4, 4)
    assert kv.pool.refs(prefix[0]) == 2


def test_freeing_returns_every_block_and_keeps_full_ones_cached() -> None:
    kv = KVManager(BlockPool(8, 4, prefix_caching=True))
    seq = computed_and_freed(kv, 10)
    assert seq.block_table == []
    assert kv.free_blocks == 8
    assert kv.pool.cached_blocks == 2


def test_a_preempted_sequence_registers_its_blocks_again_when_restarted() -> None:
    """Freeing forgets what was registered: the restarted table registers from its prefix on."""
    pool = BlockPool(8, 4, prefix_caching=True)
    kv = KVManager(pool)
    seq = computed_and_freed(kv, 9)
    # Another sequence takes every free block, evicting the cached ones.
    hog = Seq(1, [99] * 32, 32)
    kv.start(hog, [])
    kv.grow(hog, 8)
    kv.free(hog)
    assert pool.cached_blocks == 0
    kv.start(seq, kv.cached_prefix(seq))
    assert seq.num_computed == 0
    computed(kv, seq, 9)
    assert pool.hit_tokens == 0
    again = Seq(2, list(range(9)), 9)
    assert kv.cached_prefix(again) == seq.block_table[:2]


def test_without_prefix_caching_nothing_is_reused() -> None:
    kv = KVManager(BlockPool(8, 4, prefix_caching=False))
    seq = Seq(0, list(range(9)), 9)
    kv.start(seq, kv.cached_prefix(seq))
    computed(kv, seq, 9)
    kv.free(seq)
    assert kv.cached_prefix(Seq(1, list(range(9)), 9)) == []
    assert kv.pool.cached_blocks == 0


def test_a_prefix_no_one_holds_counts_against_the_free_blocks() -> None:
    """Taking an unreferenced cached block removes it from the free count before allocating."""
    kv = KVManager(BlockPool(3, 4, prefix_caching=True))
    computed_and_freed(kv, 5)
    again = Seq(1, list(range(5)), 5)
    prefix = kv.cached_prefix(again)
    assert len(prefix) == 1
    assert kv.can_start(prefix, 2)
    assert not kv.can_start(prefix, 3)
