"""Iteration-level scheduling: which sequences run the next model step, and with which tokens.

Pure decision code (no torch, no asyncio, no threads): the engine core calls `schedule` before
every step and `commit` after it. Rules, in the order `schedule` applies them:

* every running sequence that is decoding gets its one token first, so streams already
  producing text never wait behind a long prompt;
* then running sequences still in prefill get chunks of their prompt, best first, within
  what is left of the step's token budget (`max_step_tokens`); a long prompt is split over
  steps (chunked prefill) instead of stalling everyone for one huge step;
* waiting sequences are admitted, best first, while the budget, `max_running_sequences` and
  the free blocks allow their first chunk (after reusing their cached prefix), and never in
  a step that had to preempt. A waiting sequence that outranks a running one in prefill is
  admitted before that one's chunk, so a short urgent request is not held behind a long
  prompt of a lower class for the whole of its prefill; the rest come after the prefills;
* when a running sequence needs a block and none is free, the worst running sequence (lowest
  priority, then newest) is preempted: its blocks are freed and it goes back to waiting with
  everything it generated, to be recomputed when readmitted (prefix caching often still holds
  its blocks then). A sequence is never lost and the pool never overflows.

"Best" is the priority class raised one class per `priority_aging_s` waited since arrival,
so nothing starves; the same order ranks running sequences. As every sequence ages at the
same rate, that order never changes and is fixed once, at arrival. Sequences of tenants
(`core.tenants`) rank by their effective class (that aged class, floored to a whole one)
and, within it, by their tenant's weighted fair-share tag (`core.fair_share`), so a tenant
flooding the queue waits behind its own backlog, not the others; without tenants the
order is the aged class alone, as it always was.

Policy "static" is the baseline the benchmark compares against: a batch is formed from the
waiting sequences only when none runs, and runs to completion before the next is formed.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from typing import Literal

from fleetserve_runtime.core.fair_share import FairShare, effective_class
from fleetserve_runtime.core.queueing import aged_priority
from fleetserve_runtime.generate.blocks import BlockPool
from fleetserve_runtime.generate.kv_manager import KVManager
from fleetserve_runtime.generate.sequence import Seq, SeqState

__all__ = ["Chunk", "Policy", "Scheduler", "SchedulerLimits", "StepPlan"]

Policy = Literal["continuous", "static"]


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The knobs `schedule` obeys."""

    max_running_sequences: int
    max_step_tokens: int
    priority_aging_s: float
    """Seconds of waiting that raise a sequence one priority class; 0 disables aging."""
    policy: Policy = "continuous"


@dataclass(frozen=True, slots=True)
class Chunk:
    """One sequence's share of a step: `length` tokens from position `start`."""

    seq: Seq
    start: int
    length: int
    samples: bool
    """The chunk reaches the end of the sequence's tokens: its logits give the next token."""

    @property
    def token_ids(self) -> list[int]:
        """The tokens the step computes for this sequence."""
        return self.seq.tokens[self.start : self.start + self.length]


@dataclass(slots=True)
class StepPlan:
    """What one step runs, and what scheduling it changed."""

    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[Seq] = field(default_factory=list)
    admitted: list[Seq] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens the step computes."""
        return sum(chunk.length for chunk in self.chunks)


@dataclass(slots=True)
class _Draft:
    """A plan being built: chunks by sequence id, so a preempted victim's is dropped in O(1)."""

    budget: int
    chunks: dict[int, Chunk] = field(default_factory=dict)
    preempted: list[Seq] = field(default_factory=list)
    admitted: list[Seq] = field(default_factory=list)

    def add(self, chunk: Chunk) -> None:
        self.chunks[chunk.seq.seq_id] = chunk
        self.budget -= chunk.length

    def drop(self, seq: Seq) -> None:
        chunk = self.chunks.pop(seq.seq_id, None)
        if chunk is not None:
            self.budget += chunk.length


class Scheduler:
    """Waiting and running sequences over one `BlockPool`; see the module docstring."""

    def __init__(self, pool: BlockPool, limits: SchedulerLimits) -> None:
        if limits.max_running_sequences < 1 or limits.max_step_tokens < 1:
            msg = "max_running_sequences and max_step_tokens must be positive"
            raise ValueError(msg)
        self.pool = pool
        self.kv = KVManager(pool)
        self.limits = limits
        self._running: list[Seq] = []
        self._waiting: list[tuple[tuple[float, float, int], Seq]] = []
        self._fair = FairShare()
        self._num_waiting = 0
        self.preemptions = 0
        """Sequences preempted so far."""

    @property
    def num_running(self) -> int:
        """Sequences admitted and not finished (in prefill or decoding)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission, preempted ones included."""
        return self._num_waiting

    def running(self) -> Iterator[Seq]:
        """Running sequences, best first."""
        return iter(self._running)

    def add(self, seq: Seq) -> None:
        """Queue a new sequence; its rank is fixed from its priority and arrival time."""
        aging_s = self.limits.priority_aging_s
        tenant = seq.tenant
        if tenant is None:
            # Ranked as at time 0: aging keeps the order of two sequences at any time.
            level = aged_priority(seq.priority, seq.arrived_at, 0.0, aging_s)
            seq.rank = (level, 0.0, seq.seq_id)
        else:
            cost = seq.fair_cost or len(seq.tokens)
            tag = self._fair.tag(tenant.name, cost, tenant.weight)
            level = effective_class(seq.priority, seq.arrived_at, aging_s)
            seq.rank = (level, tag, seq.seq_id)
        seq.state = SeqState.WAITING
        self._push_waiting(seq)

    def finish(self, seq: Seq) -> None:
        """Take `seq` out, waiting or running, and free its blocks (finished, cancelled, failed)."""
        if seq.state is SeqState.RUNNING:
            self._running.remove(seq)
            self.kv.free(seq)
        elif seq.state is SeqState.WAITING:
            self._num_waiting -= 1
        seq.state = SeqState.FINISHED
        self._compact_waiting()

    def schedule(self) -> StepPlan:
        """Plan the next step; see the module docstring for the rules."""
        draft = _Draft(self.limits.max_step_tokens)
        if self.limits.policy == "static" and not self._running:
            self._form_static_batch(draft)
        for seq in list(self._running):
            if draft.budget <= 0:
                break
            if seq.state is SeqState.RUNNING and seq.num_computed == len(seq.tokens) - 1:
                self._schedule_running(seq, 1, draft, shrink=False)
        self._prefill(draft)
        if self._admits(draft):
            self._admit(draft)
        return StepPlan(list(draft.chunks.values()), draft.preempted, draft.admitted)

    def commit(self, plan: StepPlan, new_tokens: SequenceOf[int | None]) -> None:
        """Record a step that ran: its chunks are computed, its sampled tokens appended.

        `new_tokens` has one entry per chunk, None where the chunk did not sample. Blocks
        that became full join the prefix cache.
        """
        for chunk, token in zip(plan.chunks, new_tokens, strict=True):
            seq = chunk.seq
            seq.num_computed = chunk.start + chunk.length
            if token is not None:
                seq.tokens.append(token)
            self.kv.cache_computed(seq)

    # -- internals ---------------------------------------------------------------------

    def _admits(self, draft: _Draft) -> bool:
        """Whether this step may admit waiting sequences at all."""
        return self.limits.policy == "continuous" and not draft.preempted

    def _prefill(self, draft: _Draft) -> None:
        """Prompt chunks for the running sequences in prefill, best first.

        Before each one, the waiting sequences that outrank it are admitted.
        """
        for seq in list(self._running):
            if draft.budget <= 0:
                return
            if seq.state is not SeqState.RUNNING or seq.seq_id in draft.chunks:
                continue
            if self._admits(draft):
                self._admit(draft, better_than=seq.rank)
            want = min(len(seq.tokens) - seq.num_computed, draft.budget)
            if want > 0:
                self._schedule_running(seq, want, draft, shrink=True)

    def _schedule_running(self, seq: Seq, want: int, draft: _Draft, *, shrink: bool) -> None:
        granted = self._grow(seq, want, draft, shrink=shrink)
        if granted:
            start = seq.num_computed
            samples = start + granted == len(seq.tokens)
            draft.add(Chunk(seq, start, granted, samples))

    def _grow(self, seq: Seq, want: int, draft: _Draft, *, shrink: bool) -> int:
        """Give `seq` blocks for `want` more tokens; returns how many it got.

        Fewer when `shrink` and only fewer fit; otherwise the worst running sequences are
        preempted while none fit; 0 when `seq` itself was.
        """
        kv = self.kv
        while True:
            need = kv.blocks_for(seq.num_computed + want) - len(seq.block_table)
            free = kv.free_blocks
            if need > free and shrink:
                fit = (len(seq.block_table) + free) * self.pool.block_size - seq.num_computed
                if fit > 0:
                    want, need = fit, free
            if need <= free:
                kv.grow(seq, need)
                return want
            victim = self._running[-1]
            self._preempt(victim, draft)
            if victim is seq:
                return 0

    def _preempt(self, seq: Seq, draft: _Draft) -> None:
        self._running.remove(seq)
        draft.drop(seq)
        self.kv.free(seq)
        seq.preemptions += 1
        self.preemptions += 1
        draft.preempted.append(seq)
        seq.state = SeqState.WAITING
        self._push_waiting(seq)

    def _admit(self, draft: _Draft, better_than: tuple[float, float, int] | None = None) -> None:
        """Admit waiting sequences, best first, while they fit (and outrank `better_than`)."""
        kv = self.kv
        while draft.budget > 0 and len(self._running) < self.limits.max_running_sequences:
            seq = self._peek_waiting()
            if seq is None or (better_than is not None and seq.rank >= better_than):
                return
            prefix = kv.cached_prefix(seq)
            cached = len(prefix) * self.pool.block_size
            want = min(len(seq.tokens) - cached, draft.budget)
            need = kv.blocks_for(cached + want) - len(prefix)
            if not kv.can_start(prefix, need):
                return
            self._start(seq, prefix, draft)
            kv.grow(seq, need)
            draft.add(Chunk(seq, cached, want, cached + want == len(seq.tokens)))

    def _form_static_batch(self, draft: _Draft) -> None:
        while len(self._running) < self.limits.max_running_sequences:
            seq = self._peek_waiting()
            if seq is None:
                return
            self._start(seq, self.kv.cached_prefix(seq), draft)

    def _start(self, seq: Seq, prefix: list[int], draft: _Draft) -> None:
        """Move the best waiting sequence `seq` to running, holding its cached `prefix`."""
        heapq.heappop(self._waiting)
        self._num_waiting -= 1
        if seq.tenant is not None:
            self._fair.served(seq.rank[1])
        self.kv.start(seq, prefix)
        seq.state = SeqState.RUNNING
        bisect.insort(self._running, seq, key=_rank)
        draft.admitted.append(seq)

    def _push_waiting(self, seq: Seq) -> None:
        heapq.heappush(self._waiting, (seq.rank, seq))
        self._num_waiting += 1

    def _peek_waiting(self) -> Seq | None:
        waiting = self._waiting
        while waiting and waiting[0][1].state is not SeqState.WAITING:
            heapq.heappop(waiting)
        return waiting[0][1] if waiting else None

    def _compact_waiting(self) -> None:
        # Finished waiting sequences are dropped lazily; rebuild when they dominate the heap.
        if len(self._waiting) > 64 and len(self._waiting) > 4 * self._num_waiting:
            self._waiting = [e for e in self._waiting if e[1].state is SeqState.WAITING]
            heapq.heapify(self._waiting)


def _rank(seq: Seq) -> tuple[float, float, int]:
    return seq.rank
