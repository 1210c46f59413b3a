"""Bounded request queue with priority classes, length buckets and per-item deadlines.

The queue only stores and indexes; the batcher decides what to take. Items sit in one FIFO
per (group, bucket, priority) cell, where `group` is what a batch must not mix (for the
encoder engine, the model version that preprocessed them) and `bucket` their length bucket.
The queue is generic in the group's type, so whoever reads `Batch.group` back gets the type
it pushed; it knows nothing of any engine, so another engine can sit on the same queue.
Expired and taken items are removed lazily: they are marked and skipped, so every operation
stays O(1) amortised. Not thread-safe: its engine touches it from the event loop only.

Items of tenants (`core.tenants`) are kept in a cell in fair-share order instead of FIFO:
by their effective class (the priority aged at arrival, floored) and then their tenant's
weighted fair-share tag (`core.fair_share`, charged their length in tokens), so the batcher,
which takes each cell's items front first, serves a quiet tenant's request before a noisy
tenant's backlog. Without tenants every item is appended, FIFO, as before.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from typing_extensions import TypeVar

from fleetserve_runtime.core.fair_share import FairShare, effective_class
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.queueing import QueueBound
from fleetserve_runtime.core.tenants import Tenant

__all__ = ["Cell", "G", "PendingItem", "RequestQueue"]

G = TypeVar("G", bound=Hashable, default=Hashable)
"""The type of an item's group: items of different groups never share a batch. Defaults to
any hashable, for queues built without naming it (tests, benchmarks)."""


_seq = itertools.count()


@dataclass(slots=True, eq=False)
class PendingItem(Generic[G]):
    """One instance waiting for a batch; `ticket` is the engine's opaque completion handle."""

    length: int
    priority: Priority
    enqueued_at: float
    deadline: float
    group: G
    payload: Any
    ticket: Any
    bucket: int = 0
    request_id: str | None = None
    """The id of the request the item belongs to, for the executor's log records."""
    tenant: Tenant | None = None
    """Whom it is for, on a server with a tenants table; None without."""
    fair_key: tuple[float, float] = (0.0, 0.0)
    """(effective class, fair-share tag), set by the queue for a tenant's item."""
    seq: int = field(default_factory=lambda: next(_seq))
    live: bool = True
    """False once the item was taken into a batch or expired."""


@dataclass(slots=True)
class Cell(Generic[G]):
    """FIFO of items of one group, bucket and priority class."""

    group: G
    bucket: int
    priority: Priority
    items: deque[PendingItem[G]] = field(default_factory=deque)
    live: int = 0

    def head(self) -> PendingItem[G] | None:
        """Oldest live item, dropping dead ones from the front."""
        items = self.items
        while items and not items[0].live:
            items.popleft()
        return items[0] if items else None

    def iter_live(self) -> Iterator[PendingItem[G]]:
        """Live items, oldest first."""
        return (item for item in self.items if item.live)


class RequestQueue(Generic[G]):
    """Bounded multi-cell queue; see the module docstring."""

    def __init__(self, *, max_size: int, retry_after_s: float, aging_s: float = 0.0) -> None:
        self._bound = QueueBound(max_size, retry_after_s)
        self._aging_s = aging_s
        self._fair = FairShare()
        self._cells: dict[tuple[G, int, Priority], Cell[G]] = {}
        self._deadlines: list[tuple[float, int, PendingItem[G]]] = []
        self._size = 0
        self._passes = 0

    def __len__(self) -> int:
        """Live items waiting."""
        return self._size

    @property
    def max_size(self) -> int:
        """The bound on live items."""
        return self._bound.max_size

    def push(self, items: Sequence[PendingItem[G]]) -> None:
        """Queue all `items` of one request, or none: raise `QueueFull` when they do not fit."""
        self._bound.check(self._size, len(items))
        for item in items:
            key = (item.group, item.bucket, item.priority)
            cell = self._cells.get(key)
            if cell is None:
                cell = self._cells[key] = Cell(item.group, item.bucket, item.priority)
            if item.tenant is None:
                cell.items.append(item)
            else:
                tenant = item.tenant
                tag = self._fair.tag(tenant.name, item.length, tenant.weight)
                item.fair_key = (
                    effective_class(item.priority, item.enqueued_at, self._aging_s),
                    tag,
                )
                bisect.insort(cell.items, item, key=_fair_order)
            cell.live += 1
            heapq.heappush(self._deadlines, (item.deadline, item.seq, item))
        self._size += len(items)

    def cells(self) -> Iterator[Cell[G]]:
        """Cells that have live items."""
        return (cell for cell in self._cells.values() if cell.live)

    def cell(self, group: G, bucket: int, priority: Priority) -> Cell[G] | None:
        """The cell for that key, if it has live items."""
        cell = self._cells.get((group, bucket, priority))
        return cell if cell is not None and cell.live else None

    def take(self, item: PendingItem[G]) -> None:
        """Remove a live item (it joins a batch)."""
        self._kill(item)
        if item.tenant is not None:
            self._fair.served(item.fair_key[1])

    def pop_expired(self, now: float) -> list[PendingItem[G]]:
        """Remove and return every live item whose deadline is at or before `now`."""
        expired: list[PendingItem[G]] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            item = heapq.heappop(heap)[2]
            if item.live:
                self._kill(item)
                expired.append(item)
        self._compact()
        return expired

    def next_deadline(self) -> float | None:
        """Earliest deadline among live items (None when empty)."""
        heap = self._deadlines
        while heap and not heap[0][2].live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def oldest_enqueued_at(self) -> float | None:
        """Enqueue time of the oldest live item (None when empty)."""
        heads = (cell.head() for cell in self.cells())
        return min((head.enqueued_at for head in heads if head is not None), default=None)

    def _kill(self, item: PendingItem[G]) -> None:
        item.live = False
        self._cells[(item.group, item.bucket, item.priority)].live -= 1
        self._size -= 1

    def _compact(self) -> None:
        # Dead items are dropped lazily; rebuild the heap when they dominate it, so a burst
        # of taken items does not keep memory alive for their whole deadline.
        if len(self._deadlines) > 64 and len(self._deadlines) > 4 * self._size:
            self._deadlines = [entry for entry in self._deadlines if entry[2].live]
            heapq.heapify(self._deadlines)
        self._passes += 1
        if len(self._cells) > 64 and self._passes % 64 == 0:
            self._cells = {key: cell for key, cell in self._cells.items() if cell.live}


def _fair_order(item: PendingItem[Any]) -> tuple[float, float, int]:
    """A tenant's item's place in its cell: class, fair-share tag, arrival."""
    return (*item.fair_key, item.seq)
