"""One generation as the scheduler and the KV manager see it: its tokens and its blocks.

Pure state (no torch, no asyncio, no threads). The scheduler moves a `Seq` between its
states and the KV manager (`kv_manager`) fills and empties its block table; what the engine
keeps of a request beyond that (its stream, sampling, decoded text) is `request.EngineRequest`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.tenants import Tenant
from fleetserve_runtime.generate.blocks import chain_hash

__all__ = ["Seq", "SeqState"]


class SeqState(Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Seq:
    """One generation's tokens and the blocks that hold their KV.

    `tokens` is the prompt followed by what was generated so far; the first `num_computed`
    of them have their keys and values in the blocks of `block_table`.
    """

    seq_id: int
    tokens: list[int]
    prompt_len: int
    priority: Priority = Priority.NORMAL
    arrived_at: float = 0.0
    state: SeqState = SeqState.WAITING
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    cached_tokens: int | None = None
    """Prompt tokens reused from the prefix cache at the first admission; None before it."""
    preemptions: int = 0
    rank: tuple[float, float, int] = (0.0, 0.0, 0)
    """Set by the scheduler on `add`: lower runs first, higher is preempted first. Its
    class (aged priority), its fair-share tag (0 without tenants), its id."""
    tenant: Tenant | None = None
    """Whom it is for, on a server with a tenants table (`core.tenants`); None without."""
    fair_cost: int = 0
    """Tokens it is expected to cost (prompt plus output bound), its fair-share charge."""
    cache_root: bytes = b""
    """The parent hash of the first block (`salt_root` of the request's cache salt): only
    sequences with the same root can share cached blocks."""
    prompt_logits: bool = False
    """Every prompt position's logits are wanted (prompt log-probabilities not all computed
    yet): its chunks return all their rows, and it reuses no cached prefix, whose
    positions would not be computed."""
    _hashes: list[bytes] = field(default_factory=list, init=False, repr=False)

    def block_hashes(self, count: int, block_size: int) -> list[bytes]:
        """Chain hashes of the first `count` full blocks of `tokens`, computed once each."""
        hashes = self._hashes
        for index in range(len(hashes), count):
            parent = hashes[-1] if hashes else self.cache_root
            start = index * block_size
            hashes.append(chain_hash(parent, self.tokens[start : start + block_size]))
        return hashes[:count]
