"""The KV block pool's accounting: which blocks are free, shared, or cached for reuse.

Pure bookkeeping (no torch, no threads): the model owns the memory, this module owns the
block ids. Every block has a reference count, one per sequence whose block table holds it.

Prefix caching: a block whose `block_size` token slots are all computed is registered under
a hash chained over the token ids of every block before it and its own (`chain_hash`), so
equal hashes mean equal whole prefixes, not just equal blocks. A new sequence whose prompt
starts with registered blocks takes references to them instead of recomputing them. A block
whose last reference goes stays registered in an LRU of cached free blocks: it still counts
as free (usage ratio, admission) but is reused by hash until a fresh block is needed and none
is left uncached, when the least recently freed is evicted.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool", "chain_hash", "salt_root"]


def chain_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The hash of one full block given its parent block's hash (b"" for the first block).

    A cryptographic digest, because two prefixes that collide would silently share KV.
    """
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def salt_root(salt: str | None, tenant: str | None = None) -> bytes:
    """The first block's parent hash for requests with cache salt `salt` (b"" for none).

    A digest of its own kind (personalised), so no salt can produce a chain that equals
    another salt's, or the unsalted one's. On a server with tenants every request has a
    `tenant` (the default one's included), hashed with its salt under a third kind: blocks
    are never shared between tenants, whatever salts they send.
    """
    if tenant is not None:
        blob = json.dumps([tenant, salt]).encode()
        return hashlib.blake2b(blob, digest_size=16, person=b"tenant-salt").digest()
    if salt is None:
        return b""
    return hashlib.blake2b(salt.encode(), digest_size=16, person=b"cache-salt").digest()


class BlockPool:
    """Block ids `0 .. num_blocks-1`, reference-counted, with an optional prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool) -> None:
        if num_blocks < 1 or block_size < 1:
            msg = f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}"
            raise ValueError(msg)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._refs = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._by_hash: dict[bytes, int] = {}
        # Reversed so that blocks are handed out in id order (a list pops from its end).
        self._free_plain = list(range(num_blocks - 1, -1, -1))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self.hit_tokens = 0
        """Prompt tokens served from the prefix cache, over first admissions."""
        self.query_tokens = 0
        """Prompt tokens looked up in the prefix cache, over first admissions."""
        self.resumed_hit_tokens = 0
        """Tokens a preempted sequence found again in the cache when it was re-admitted: its
        own blocks, mostly, so counting them as hits would flatter the cache."""
        self.resumed_query_tokens = 0
        """Tokens looked up by re-admitted sequences."""

    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds (cached ones included: they are evicted on demand)."""
        return len(self._free_plain) + len(self._free_cached)

    @property
    def cached_blocks(self) -> int:
        """Free blocks that still hold a registered prefix."""
        return len(self._free_cached)

    @property
    def usage_ratio(self) -> float:
        """Share of blocks held by sequences."""
        return 1.0 - self.free_blocks / self.num_blocks

    def refs(self, block: int) -> int:
        """How many sequences hold `block`."""
        return self._refs[block]

    def cached_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """The registered blocks of the longest cached prefix of `hashes` (takes nothing)."""
        if not self.prefix_caching:
            return []
        blocks: list[int] = []
        for block_hash in hashes:
            block = self._by_hash.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def acquire(self, blocks: Sequence[int], *, query_tokens: int, resumed: bool) -> None:
        """Take a reference to `blocks`, a `cached_prefix` answer, and count the lookup.

        `query_tokens` is what the lookup counts as asked (the sequence's length); `resumed`:
        the sequence was admitted before and preempted, so the lookup counts apart.
        """
        if not self.prefix_caching:
            return
        for block in blocks:
            if self._refs[block] == 0:
                del self._free_cached[block]
            self._refs[block] += 1
        hit_tokens = len(blocks) * self.block_size
        if resumed:
            self.resumed_query_tokens += query_tokens
            self.resumed_hit_tokens += hit_tokens
        else:
            self.query_tokens += query_tokens
            self.hit_tokens += hit_tokens

    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh blocks (one reference each), or None when fewer are free."""
        if count > self.free_blocks:
            return None
        blocks: list[int] = []
        for _ in range(count):
            if self._free_plain:
                block = self._free_plain.pop()
            else:
                block, _ = self._free_cached.popitem(last=False)
                self._unregister(block)
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block; a block left unreferenced becomes free.

        Pass a block table in order: its tail is freed first, so the tail is evicted before
        the prefix that other requests are likelier to share.
        """
        for block in reversed(blocks):
            refs = self._refs[block] - 1
            if refs < 0:
                msg = f"block {block} released more often than it was taken"
                raise ValueError(msg)
            self._refs[block] = refs
            if refs:
                continue
            if self._hash[block] is None:
                self._free_plain.append(block)
            else:
                self._free_cached[block] = None

    def register(self, block: int, block_hash: bytes) -> None:
        """Record that `block` now holds the full block `block_hash` names (KV computed).

        When another block already holds the same prefix (two sequences computed it in the
        same step) the first stays the one found; this one is freed as a plain block.
        """
        if not self.prefix_caching or self._hash[block] is not None:
            return
        if block_hash in self._by_hash:
            return
        self._hash[block] = block_hash
        self._by_hash[block_hash] = block

    def _unregister(self, block: int) -> None:
        block_hash = self._hash[block]
        if block_hash is not None:
            self._hash[block] = None
            del self._by_hash[block_hash]
