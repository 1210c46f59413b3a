"""Request queue: bound, atomic admission, expiry, lazy removal."""

from __future__ import annotations

import pytest

from fleetserve_runtime.errors import QueueFull
from fleetserve_runtime.request_queue import Priority, RequestQueue
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
