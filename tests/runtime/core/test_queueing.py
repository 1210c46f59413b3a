"""The admission rules both engines share: the queue's bound, the timeout's, priority aging."""

from __future__ import annotations

import pytest

from fleetserve_runtime.core.errors import InvalidInput, QueueFull
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.queueing import QueueBound, aged_priority, resolve_timeout


def test_a_queue_bound_admits_up_to_its_size_and_refuses_with_the_retry_hint() -> None:
    bound = QueueBound(max_size=4, retry_after_s=2.0)
    bound.check(3)
    bound.check(1, incoming=3)
    with pytest.raises(QueueFull) as refused:
        bound.check(4)
    assert refused.value.retry_after_s == 2.0
    assert refused.value.message == "queue is full (4 of 4 waiting); retry after 2s"


def test_a_queue_bound_refuses_a_request_whose_items_do_not_all_fit() -> None:
    bound = QueueBound(max_size=4, retry_after_s=1.0)
    with pytest.raises(QueueFull, match=r"\(2 of 4 waiting\); retry after 1s"):
        bound.check(2, incoming=3)


def test_a_timeout_left_unset_takes_the_default() -> None:
    assert resolve_timeout(None, default=5_000, maximum=30_000, refusal="{requested}") == 5_000
    assert resolve_timeout(None, default=60.0, maximum=600.0, refusal="{requested}") == 60.0


@pytest.mark.parametrize("requested", [1, 30_000])
def test_a_timeout_within_its_bounds_is_kept(requested: int) -> None:
    kept = resolve_timeout(requested, default=5_000, maximum=30_000, refusal="{requested}")
    assert kept == requested


@pytest.mark.parametrize("requested", [0, -1, 30_001])
def test_a_timeout_outside_its_bounds_is_refused_in_the_callers_words(requested: int) -> None:
    refusal = "timeout_ms must be between 1 and {maximum}, got {requested}"
    with pytest.raises(InvalidInput) as refused:
        resolve_timeout(requested, default=5_000, maximum=30_000, refusal=refusal)
    assert refused.value.message == f"timeout_ms must be between 1 and 30000, got {requested}"


def test_a_timeout_refusal_may_format_seconds() -> None:
    refusal = "timeout must be between 0 and {maximum:g}s, got {requested:g}"
    with pytest.raises(InvalidInput, match=r"^timeout must be between 0 and 600s, got 1e\+09$"):
        resolve_timeout(1e9, default=60.0, maximum=600.0, refusal=refusal)


def test_aging_raises_a_waiting_request_one_class_per_period() -> None:
    assert aged_priority(Priority.LOW, 10.0, 10.0, 5.0) == 2.0
    assert aged_priority(Priority.LOW, 10.0, 15.0, 5.0) == 1.0
    assert aged_priority(Priority.LOW, 10.0, 25.0, 5.0) == -1.0


def test_without_aging_the_class_alone_ranks() -> None:
    assert aged_priority(Priority.HIGH, 0.0, 1e6, 0.0) == 0.0
    assert aged_priority(Priority.LOW, 0.0, 1e6, 0.0) == 2.0


def test_the_aged_order_of_two_requests_is_the_same_at_any_time() -> None:
    """What lets the generative scheduler rank once, at arrival, as at time 0."""
    old_low = (Priority.LOW, 100.0)
    new_high = (Priority.HIGH, 108.0)
    for now in (0.0, 108.0, 500.0):
        low = aged_priority(*old_low, now, 5.0)
        high = aged_priority(*new_high, now, 5.0)
        assert high < low
    # 10s later the low one has caught up two classes: a tie, whatever the time.
    late_high = (Priority.HIGH, 110.0)
    for now in (0.0, 110.0, 500.0):
        assert aged_priority(*old_low, now, 5.0) == aged_priority(*late_high, now, 5.0)
