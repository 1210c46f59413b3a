"""Request queue: bound, atomic admission, expiry, lazy removal."""

from __future__ import annotations

import weakref

import pytest

from fleetserve_runtime.core.errors import QueueFull
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.encoder.request_queue import RequestQueue
from fleetserve_runtime.testing import FakeClock, make_items


def test_full_queue_refuses_whole_request_with_retry_after() -> None:
    """A request that does not fit is refused whole, with the retry hint; nothing is lost."""
    clock, queue = FakeClock(), RequestQueue(max_size=3, retry_after_s=2)
    queue.push(make_items([5, 5], now=clock()))
    with pytest.raises(QueueFull, match="queue is full") as caught:
        queue.push(make_items([5, 5], now=clock()))
    assert caught.value.retry_after_s == 2
    assert len(queue) == 2
    queue.push(make_items([5], now=clock()))
    assert len(queue) == 3


def test_pop_expired_removes_only_overdue_items() -> None:
    """Expiry takes items whose deadline passed and leaves the rest in order."""
    clock, queue = FakeClock(), RequestQueue(max_size=10, retry_after_s=1)
    short = make_items([1], now=clock(), timeout_s=0.1)
    long = make_items([2], now=clock(), timeout_s=10)
    queue.push(short + long)
    assert queue.pop_expired(clock.advance(0.2)) == short
    assert len(queue) == 1
    assert queue.next_deadline() == pytest.approx(clock() - 0.2 + 10)


def test_taken_items_are_skipped_lazily() -> None:
    """Taking an item frees its slot and it never shows up as a head or expiry again."""
    clock, queue = FakeClock(), RequestQueue(max_size=10, retry_after_s=1)
    items = make_items([1, 2, 3], now=clock(), timeout_s=0.1)
    queue.push(items)
    queue.take(items[0])
    cell = queue.cell("v1", 0, Priority.NORMAL)
    assert cell is not None
    assert cell.head() is items[1]
    assert queue.pop_expired(clock.advance(1)) == items[1:]
    assert len(queue) == 0
    assert queue.oldest_enqueued_at() is None


def test_priority_parse() -> None:
    """Priority names parse case-insensitively; unknown names list the valid ones."""
    assert Priority.parse("High") is Priority.HIGH
    with pytest.raises(ValueError, match="high, normal, low"):
        Priority.parse("urgent")


def test_an_item_expires_at_its_deadline_exactly() -> None:
    """A deadline equal to `now` counts as passed."""
    clock, queue = FakeClock(), RequestQueue(max_size=10, retry_after_s=1)
    items = make_items([1], now=clock(), timeout_s=0.1)
    queue.push(items)
    assert queue.pop_expired(items[0].deadline) == items


def test_next_deadline_skips_taken_items_and_is_none_when_drained() -> None:
    """A taken item's deadline no longer counts; a drained queue has none."""
    clock, queue = FakeClock(), RequestQueue(max_size=10, retry_after_s=1)
    first = make_items([1], now=clock(), timeout_s=0.1)
    second = make_items([2], now=clock(), timeout_s=0.2)
    queue.push(first + second)
    queue.take(first[0])
    assert queue.next_deadline() == second[0].deadline
    queue.take(second[0])
    assert queue.next_deadline() is None


def test_a_drained_cell_is_not_returned_and_has_no_head() -> None:
    """`cell()` answers only for cells with live items; a held reference sees no head."""
    clock, queue = FakeClock(), RequestQueue(max_size=10, retry_after_s=1)
    items = make_items([1], now=clock(), group="v2")
    queue.push(items)
    cell = queue.cell("v2", 0, Priority.NORMAL)
    assert cell is not None
    assert cell.group == "v2"
    assert queue.cell("v1", 0, Priority.NORMAL) is None
    queue.take(items[0])
    assert queue.cell("v2", 0, Priority.NORMAL) is None
    assert cell.head() is None


def test_live_items_keep_their_deadlines_after_a_burst_is_taken() -> None:
    """Once taken items dominate the deadline index it is rebuilt; the live ones stay in it."""
    clock, queue = FakeClock(), RequestQueue(max_size=200, retry_after_s=1)
    items = [item for i in range(100) for item in make_items([1], now=clock(), timeout_s=1 + i)]
    queue.push(items)
    for item in items[:90]:
        queue.take(item)
    assert queue.pop_expired(clock()) == []
    assert queue.next_deadline() == items[90].deadline
    assert queue.pop_expired(clock.advance(200)) == items[90:]


def test_a_burst_drained_entirely_leaves_a_working_empty_queue() -> None:
    """Taking every item of a large burst leaves nothing due and room for the next request."""
    clock, queue = FakeClock(), RequestQueue(max_size=100, retry_after_s=1)
    items = make_items([1] * 70, now=clock())
    queue.push(items)
    for item in items:
        queue.take(item)
    assert queue.pop_expired(clock()) == []
    assert queue.next_deadline() is None
    queue.push(make_items([2], now=clock()))
    assert len(queue) == 1


class _Body:
    """A request body the test can watch being freed (weak references)."""


def test_cells_of_gone_versions_are_released_and_live_ones_kept() -> None:
    """Past 64 cells, drained ones are freed within 64 expiry passes; live ones stay usable.

    Drained cells are versions that came and went; freeing them frees the items they held.
    """
    clock, queue = FakeClock(), RequestQueue(max_size=100, retry_after_s=1)
    kept = make_items([1], now=clock(), group="v0")
    gone = [item for i in range(1, 65) for item in make_items([1], now=clock(), group=f"v{i}")]
    bodies = []
    for item in gone:
        item.payload = _Body()
        bodies.append(weakref.ref(item.payload))
    queue.push(kept + gone)
    for item in gone:
        queue.take(item)
    del gone, item
    for _ in range(64):
        queue.pop_expired(clock())
    assert [body() for body in bodies] == [None] * 64
    cell = queue.cell("v0", 0, Priority.NORMAL)
    assert cell is not None
    assert cell.head() is kept[0]
    queue.push(make_items([2], now=clock(), group="v1"))
    assert len(queue) == 2
    assert [cell.group for cell in queue.cells()] == ["v0", "v1"]
