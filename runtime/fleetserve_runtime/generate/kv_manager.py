"""A sequence's blocks: what it reuses from the prefix cache, allocates, registers and frees.

Pure bookkeeping (no torch, no asyncio, no threads) between the scheduler, which decides who
gets blocks, and the `BlockPool`, which counts block ids: the manager turns the scheduler's
decisions into pool calls on one sequence's block table, and remembers how much of each
table is registered in the prefix cache so that every full block is registered once.
"""

from __future__ import annotations

from fleetserve_runtime.generate.blocks import BlockPool
from fleetserve_runtime.generate.sequence import Seq

__all__ = ["KVManager"]


class KVManager:
    """The block tables of the sequences that hold blocks of one `BlockPool`."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self._registered: dict[int, int] = {}
        """By sequence id: the full blocks at the head of its table already registered."""

    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds."""
        return self.pool.free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that `num_tokens` token slots occupy."""
        return -(-num_tokens // self.pool.block_size)

    def cached_prefix(self, seq: Seq) -> list[int]:
        """The cached blocks `seq` could start from (takes nothing)."""
        pool = self.pool
        if not pool.prefix_caching or seq.prompt_logits:
            return []
        # The last token is always computed: its logits are what the first step samples.
        reusable = (len(seq.tokens) - 1) // pool.block_size
        return pool.cached_prefix(seq.block_hashes(reusable, pool.block_size))

    def can_start(self, prefix: list[int], need: int) -> bool:
        """Whether `need` fresh blocks are free once the cached `prefix` is taken."""
        pool = self.pool
        # Taking a cached block that no one holds removes it from the free count.
        taken_free = sum(1 for block in prefix if pool.refs(block) == 0)
        return need <= pool.free_blocks - taken_free

    def start(self, seq: Seq, prefix: list[int]) -> None:
        """Give a sequence that holds no blocks the cached `prefix`, as computed."""
        pool = self.pool
        resumed = seq.cached_tokens is not None
        pool.acquire(prefix, query_tokens=len(seq.tokens), resumed=resumed)
        seq.block_table = list(prefix)
        seq.num_computed = len(prefix) * pool.block_size
        self._registered[seq.seq_id] = len(prefix)
        if not resumed:
            seq.cached_tokens = seq.num_computed

    def grow(self, seq: Seq, count: int) -> None:
        """Append `count` fresh blocks to `seq`'s table; the caller checked they are free."""
        seq.block_table.extend(self.pool.allocate(count) or ())

    def free(self, seq: Seq) -> None:
        """Release every block `seq` holds (finished, cancelled or preempted)."""
        self.pool.release(seq.block_table)
        seq.block_table = []
        self._registered.pop(seq.seq_id, None)

    def cache_computed(self, seq: Seq) -> None:
        """Register the blocks of `seq` that became full (their KV computed) for reuse."""
        pool = self.pool
        if not pool.prefix_caching:
            return
        full = seq.num_computed // pool.block_size
        registered = self._registered.get(seq.seq_id, 0)
        if full > registered:
            hashes = seq.block_hashes(full, pool.block_size)
            for index in range(registered, full):
                pool.register(seq.block_table[index], hashes[index])
            self._registered[seq.seq_id] = full
