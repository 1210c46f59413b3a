"""Batching policy: given the queue and the time, form the next batch or say when to look again.

Pure decision code: no asyncio, no torch, the clock is an argument. The encoder engine
(`encoder.engine`) calls `plan_batch` whenever the executor can take another batch and the
queue changed or a wake-up time passed. It is generic in the queue's group type: the batch
it forms carries the group its items were queued under. Rules:

* expired items are removed first and returned, so they never cost compute;
* a batch is dispatched when `max_batch_size` items wait, or when the oldest has waited
  `max_queue_delay`, whichever comes first;
* a batch holds items of one model version and starts from one length bucket; when that
  bucket cannot fill it, items of the nearest buckets join as long as the batch's padding
  efficiency (real / padded tokens) stays above a floor; it is padded only to its own
  longest member and stays within the padded-token budget;
* the first item is the one with the best *effective* priority (its class, raised one class
  per `aging` waited, so nothing starves), and each lower class with items waiting in that
  bucket is guaranteed a share of the batch.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic

from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.queueing import aged_priority
from fleetserve_runtime.encoder.request_queue import Cell, G, PendingItem, RequestQueue

__all__ = [
    "Batch",
    "BatchLimits",
    "BucketPolicy",
    "FixedBuckets",
    "LearnedBuckets",
    "Plan",
    "make_bucket_policy",
    "plan_batch",
]


class BucketPolicy:
    """Maps a length to its bucket index; subclasses decide where the edges are."""

    def __init__(self, edges: Sequence[int]) -> None:
        self._edges = list(edges)

    @property
    def edges(self) -> list[int]:
        """Upper bounds (inclusive) of the buckets, ascending."""
        return list(self._edges)

    def bucket_of(self, length: int) -> int:
        """Index of the bucket holding `length` (the last bucket takes everything longer)."""
        return min(bisect.bisect_left(self._edges, length), len(self._edges) - 1)

    def observe(self, length: int) -> None:
        """Record an observed length (learned policies adapt; fixed ones ignore it)."""


class FixedBuckets(BucketPolicy):
    """Edges from configuration; `[max_len]` alone means no bucketing."""


class LearnedBuckets(BucketPolicy):
    """Edges at quantiles of recently observed lengths, re-learned every `refresh` inputs.

    The edges start as powers of two, a shape-agnostic guess, and are first learned after
    `first` inputs, then re-learned at doubling counts until `refresh`, so a fresh replica
    pads well within its first few hundred requests.
    """

    # Finer in the tail, where lengths spread: on the mixed query/sentence profile these give
    # ~0.90 padding efficiency with ~9 requests per bucket out of 64 waiting (0.2-step
    # quantiles give 0.84; deciles 0.93 but batches half as large).
    QUANTILES = (0.25, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)

    def __init__(
        self, max_len: int, *, window: int = 4096, refresh: int = 512, first: int = 64
    ) -> None:
        start = [2**k for k in range(3, max(4, math.ceil(math.log2(max_len))))]
        super().__init__(sorted({*[e for e in start if e < max_len], max_len}))
        self._max_len = max_len
        self._window = window
        self._refresh = refresh
        self._next_learn = min(first, refresh)
        self._seen: list[int] = []
        self._next = 0
        self._count = 0

    def observe(self, length: int) -> None:
        """Record `length` in the window; re-learn edges every `refresh` observations."""
        if len(self._seen) < self._window:
            self._seen.append(length)
        else:
            self._seen[self._next] = length
            self._next = (self._next + 1) % self._window
        self._count += 1
        if self._count == self._next_learn:
            self._next_learn = min(2 * self._count, self._count + self._refresh)
            self._edges = quantile_edges(self._seen, self.QUANTILES, self._max_len)


def quantile_edges(lengths: Sequence[int], quantiles: Sequence[float], max_len: int) -> list[int]:
    """Bucket edges at the given quantiles of `lengths`, deduplicated, ending at `max_len`."""
    ordered = sorted(lengths)
    last = len(ordered) - 1
    edges = {min(ordered[round(q * last)], max_len) for q in quantiles}
    return sorted(edges | {max_len})


def make_bucket_policy(buckets: str | list[int], max_len: int) -> BucketPolicy:
    """Build the policy for a `batching.buckets` setting: `auto`, `none` or explicit edges."""
    if buckets == "auto":
        return LearnedBuckets(max_len)
    if buckets == "none":
        return FixedBuckets([max_len])
    if isinstance(buckets, list):
        return FixedBuckets(sorted({*buckets, max_len}))
    msg = f"unknown buckets setting {buckets!r}"
    raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The knobs `plan_batch` obeys; built once from `RuntimeConfig`."""

    max_batch_size: int
    max_queue_delay_s: float
    max_batch_tokens: int
    """0 means no padded-token budget."""
    aging_s: float
    lower_class_share: float
    min_padding_efficiency: float = 1.0
    """Neighbouring buckets may top up a batch while real/padded tokens stay at or above
    this; 1.0 keeps batches to one bucket."""


@dataclass(frozen=True, slots=True)
class Batch(Generic[G]):
    """Items that run together; filled by `plan_batch`, consumed by the executor."""

    items: tuple[PendingItem[G], ...]
    group: G
    pad_to: int
    """Longest member, in tokens: every row is padded to it."""
    real_tokens: int
    formed_at: float

    @property
    def padded_tokens(self) -> int:
        """Tokens the batch occupies once padded to a rectangle."""
        return len(self.items) * self.pad_to


@dataclass(frozen=True, slots=True)
class Plan(Generic[G]):
    """What `plan_batch` decided: a batch (or none), expired items, and when to look again."""

    batch: Batch[G] | None
    expired: tuple[PendingItem[G], ...]
    wake_at: float | None
    """When the decision may change without new arrivals (delay or deadline); None: never."""


def plan_batch(
    queue: RequestQueue[G], now: float, limits: BatchLimits, *, not_before: float | None = None
) -> Plan[G]:
    """Decide the next batch; takes the chosen items out of `queue`.

    `not_before` is when the executor expects to need the next batch (its running batch is
    about to end); until then only a full bucket is dispatched, so batches formed while the
    device is busy are as large as the queue allows. None means the executor is idle.
    """
    expired = tuple(queue.pop_expired(now))
    oldest = queue.oldest_enqueued_at()
    if oldest is None:
        return Plan(None, expired, None)
    due = oldest + limits.max_queue_delay_s
    busy = not_before is not None and now < not_before
    if not busy and len(queue) < limits.max_batch_size and now < due:
        return Plan(None, expired, _earliest(due, queue.next_deadline()))
    by_bucket: dict[tuple[G, int], list[Cell[G]]] = {}
    for cell in queue.cells():
        by_bucket.setdefault((cell.group, cell.bucket), []).append(cell)
    # An idle executor takes the most urgent bucket once the delay passed or a full batch's
    # worth waits overall; a busy one only takes a full bucket (see `not_before`).
    any_bucket = not busy and (now >= due or len(queue) >= limits.max_batch_size)
    key = _choose_bucket(by_bucket, now, limits, any_bucket=any_bucket)
    if key is None:
        hold = max(due, not_before) if not_before is not None else due
        return Plan(None, expired, _earliest(hold, queue.next_deadline()))
    batch = _fill(queue, by_bucket, key, now, limits)
    return Plan(batch, expired, None)


def _earliest(due: float, deadline: float | None) -> float:
    return due if deadline is None else min(due, deadline)


def _effective(item: PendingItem[G], now: float, aging_s: float) -> tuple[float, int]:
    return (aged_priority(item.priority, item.enqueued_at, now, aging_s), item.seq)


def _choose_bucket(
    by_bucket: dict[tuple[G, int], list[Cell[G]]],
    now: float,
    limits: BatchLimits,
    *,
    any_bucket: bool,
) -> tuple[G, int] | None:
    """The (group, bucket) the next batch starts from, or None to wait.

    Buckets are ranked by the effective priority of their most urgent item, a full bucket
    counting one class better. The winner is taken if it is full or `any_bucket` holds;
    a partial winner otherwise waits until the executor needs a batch. Because the ranking
    ages, an item in a partial bucket eventually outranks buckets that never stop being
    full, so nothing starves behind them.
    """
    best: tuple[tuple[float, int], bool, tuple[G, int]] | None = None
    for key, cells in by_bucket.items():
        full = sum(cell.live for cell in cells) >= limits.max_batch_size
        heads = [head for cell in cells if (head := cell.head()) is not None]
        level, seq = min(_effective(head, now, limits.aging_s) for head in heads)
        score = (level - 1.0 if full else level, seq)
        if best is None or score < best[0]:
            best = (score, full, key)
    if best is None or not (best[1] or any_bucket):
        return None
    return best[2]


def _neighbours(by_bucket: dict[tuple[G, int], list[Cell[G]]], key: tuple[G, int]) -> list[Cell[G]]:
    """Cells of the same group in other buckets, nearest bucket first, then by priority."""
    group, bucket = key
    others = [k for k in by_bucket if k[0] == group and k != key]
    others.sort(key=lambda k: (abs(k[1] - bucket), k[1]))
    return [cell for k in others for cell in sorted(by_bucket[k], key=lambda c: c.priority)]


class _Filler(Generic[G]):
    """Accumulates one batch within the size and padded-token limits."""

    def __init__(self, cells: list[Cell[G]], now: float, limits: BatchLimits) -> None:
        self.limits = limits
        self.now = now
        self.iters = {cell.priority: cell.iter_live() for cell in cells}
        self.pending = {p: next(it, None) for p, it in self.iters.items()}
        self.chosen: list[PendingItem[G]] = []
        self.longest = 0
        self.real = 0

    @property
    def is_full(self) -> bool:
        """True once the batch holds `max_batch_size` items."""
        return len(self.chosen) >= self.limits.max_batch_size

    def _fits(self, item: PendingItem[G], *, floor: float) -> bool:
        count = len(self.chosen) + 1
        longest = max(self.longest, item.length)
        budget = self.limits.max_batch_tokens
        if self.chosen and budget and count * longest > budget:
            return False
        return self.real + item.length >= floor * count * longest

    def _add(self, item: PendingItem[G]) -> None:
        self.chosen.append(item)
        self.longest = max(self.longest, item.length)
        self.real += item.length

    def admit(self, priority: Priority) -> bool:
        """Add the next item of `priority` if it fits; False when it does not (or none left).

        An item that does not fit the token budget closes its class for this batch, so one
        long request cannot stop other classes from filling the batch.
        """
        item = self.pending[priority]
        if item is None or self.is_full:
            return False
        if not self._fits(item, floor=0.0):
            self.pending[priority] = None
            return False
        self._add(item)
        self.pending[priority] = next(self.iters[priority], None)
        return True

    def admit_shares(self, lower: list[Priority]) -> None:
        """Give each lower class with items waiting its guaranteed share of the batch."""
        if self.limits.lower_class_share <= 0:
            return
        share = max(1, int(self.limits.lower_class_share * self.limits.max_batch_size))
        for priority in lower:
            for _ in range(share):
                if not self.admit(priority):
                    break

    def top_up(self, items: Iterator[PendingItem[G]]) -> None:
        """Add neighbouring buckets' items while the batch stays efficient enough."""
        floor = self.limits.min_padding_efficiency
        for item in items:
            if self.is_full:
                return
            if self._fits(item, floor=floor):
                self._add(item)

    def best_waiting(self) -> Priority | None:
        """The class whose next item has the best effective priority."""
        waiting = [(p, item) for p, item in self.pending.items() if item is not None]
        if not waiting:
            return None
        return min(waiting, key=lambda pair: _effective(pair[1], self.now, self.limits.aging_s))[0]


def _fill(
    queue: RequestQueue[G],
    by_bucket: dict[tuple[G, int], list[Cell[G]]],
    key: tuple[G, int],
    now: float,
    limits: BatchLimits,
) -> Batch[G]:
    """Take one batch from the chosen bucket, topped up from its neighbours.

    Lower-class shares go first, then the bucket's items by effective priority, then items
    of the nearest buckets while the padding efficiency floor holds.
    """
    cells = sorted(by_bucket[key], key=lambda cell: cell.priority)
    filler = _Filler[G](cells, now, limits)
    # The most urgent item goes first, whatever its class: shares must not crowd it out.
    if (first := filler.best_waiting()) is not None:
        filler.admit(first)
    filler.admit_shares([cell.priority for cell in cells[1:]])
    while not filler.is_full and (best := filler.best_waiting()) is not None:
        filler.admit(best)
    if limits.min_padding_efficiency < 1.0:
        filler.top_up(i for cell in _neighbours(by_bucket, key) for i in cell.iter_live())
    for item in filler.chosen:
        queue.take(item)
    return Batch(
        items=tuple(filler.chosen),
        group=key[0],
        pad_to=filler.longest,
        real_tokens=filler.real,
        formed_at=now,
    )
