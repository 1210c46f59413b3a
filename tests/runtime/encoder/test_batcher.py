"""Batching policy: triggers, buckets, padding, token budget, priorities, aging, expiry."""

from __future__ import annotations

from collections import Counter

import pytest

from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.encoder.batcher import (
    Batch,
    BatchLimits,
    FixedBuckets,
    LearnedBuckets,
    make_bucket_policy,
    plan_batch,
    quantile_edges,
)
from fleetserve_runtime.encoder.request_queue import RequestQueue
from fleetserve_runtime.testing import FakeClock, make_items


def limits(**overrides: float) -> BatchLimits:
    values = {
        "max_batch_size": 4,
        "max_queue_delay_s": 0.010,
        "max_batch_tokens": 0,
        "aging_s": 0.2,
        "lower_class_share": 0.0,
    }
    values.update(overrides)
    return BatchLimits(**values)  # type: ignore[arg-type]


def new_queue(size: int = 100) -> RequestQueue:
    return RequestQueue(max_size=size, retry_after_s=1)


def formed(
    queue: RequestQueue, now: float, lim: BatchLimits, *, not_before: float | None = None
) -> Batch:
    """The batch `plan_batch` forms now; the test fails when it forms none."""
    batch = plan_batch(queue, now, lim, not_before=not_before).batch
    assert batch is not None, "no batch was formed"
    return batch


def test_waits_for_delay_when_batch_not_full() -> None:
    """Fewer items than max_batch_size and a fresh queue: no batch, wake at the delay."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5, 6], now=clock()))
    plan = plan_batch(queue, clock(), limits())
    assert plan.batch is None
    assert plan.wake_at == pytest.approx(clock() + 0.010)


def test_dispatches_when_delay_passed() -> None:
    """Once the oldest item waited max_queue_delay, a partial batch goes."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5, 6], now=clock()))
    clock.advance(0.011)
    assert [i.length for i in formed(queue, clock(), limits()).items] == [5, 6]
    assert len(queue) == 0


def test_dispatches_at_max_batch_size_without_waiting() -> None:
    """max_batch_size items dispatch at once, and only that many are taken."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5] * 6, now=clock()))
    assert len(formed(queue, clock(), limits()).items) == 4
    assert len(queue) == 2


def test_batch_padded_to_its_longest_member() -> None:
    """pad_to is the batch's own longest item, and token counts follow."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([3, 9, 4, 7], now=clock()))
    batch = formed(queue, clock(), limits())
    assert batch.pad_to == 9
    assert batch.real_tokens == 23
    assert batch.padded_tokens == 36


def test_buckets_keep_lengths_apart() -> None:
    """Short and long items land in different batches when buckets separate them."""
    clock, queue = FakeClock(), new_queue()
    policy = FixedBuckets([8, 64])
    queue.push(make_items([4, 50, 5, 60, 6, 55, 7, 58], now=clock(), bucket_of=policy.bucket_of))
    first = formed(queue, clock(), limits())
    second = formed(queue, clock(), limits())
    assert {i.length for i in first.items} == {4, 5, 6, 7}
    assert {i.length for i in second.items} == {50, 60, 55, 58}
    assert first.real_tokens / first.padded_tokens > 0.75


def test_token_budget_limits_padded_tokens() -> None:
    """A batch never exceeds max_batch_tokens (padded), but always holds at least one item."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([30, 30, 30, 30], now=clock()))
    batch = formed(queue, clock(), limits(max_batch_tokens=64))
    assert batch.padded_tokens <= 64
    assert len(batch.items) == 2
    queue2 = new_queue()
    queue2.push(make_items([100], now=clock()))
    clock.advance(1)
    lone = formed(queue2, clock(), limits(max_batch_tokens=64))
    assert len(lone.items) == 1


def test_expired_items_are_returned_not_batched() -> None:
    """Items past their deadline come back as expired and never join a batch."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5], now=clock(), timeout_s=0.005))
    queue.push(make_items([6], now=clock(), timeout_s=5))
    clock.advance(0.02)
    plan = plan_batch(queue, clock(), limits())
    assert [i.length for i in plan.expired] == [5]
    assert plan.batch is not None
    assert [i.length for i in plan.batch.items] == [6]


def test_wake_at_is_the_earlier_of_delay_and_deadline() -> None:
    """A deadline before the delay wakes the scheduler in time to answer 504."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5], now=clock(), timeout_s=0.002))
    plan = plan_batch(queue, clock(), limits())
    assert plan.wake_at == pytest.approx(clock() + 0.002)


def test_high_priority_goes_first() -> None:
    """With more items than fit, high-priority items are chosen over older normal ones."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5] * 4, now=clock(), priority=Priority.NORMAL))
    clock.advance(0.001)
    queue.push(make_items([6] * 4, now=clock(), priority=Priority.HIGH))
    batch = formed(queue, clock(), limits())
    assert all(i.priority is Priority.HIGH for i in batch.items)


def test_aging_lifts_a_waiting_low_request() -> None:
    """A low request that waited long enough outranks fresh high ones: no starvation."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5], now=clock(), priority=Priority.LOW))
    clock.advance(0.5)  # 2.5 classes of aging at 0.2 s per class
    queue.push(make_items([6] * 4, now=clock(), priority=Priority.HIGH))
    batch = formed(queue, clock(), limits(max_batch_size=2))
    assert batch.items[0].priority is Priority.LOW


@pytest.mark.parametrize(
    ("waiting", "max_batch_size", "share", "chosen"),
    [
        pytest.param(
            {Priority.HIGH: 10, Priority.LOW: 10},
            10,
            0.2,
            {Priority.HIGH: 8, Priority.LOW: 2},
            id="each-lower-class-with-items-gets-its-share",
        ),
        pytest.param(
            {Priority.HIGH: 8, Priority.NORMAL: 1, Priority.LOW: 2},
            8,
            0.25,
            {Priority.HIGH: 5, Priority.NORMAL: 1, Priority.LOW: 2},
            id="a-class-short-of-its-share-leaves-the-next-class-its-share",
        ),
        pytest.param(
            {Priority.HIGH: 4, Priority.LOW: 2},
            4,
            0.1,
            {Priority.HIGH: 3, Priority.LOW: 1},
            id="a-share-below-one-item-is-exactly-one",
        ),
    ],
)
def test_lower_classes_get_a_guaranteed_share(
    waiting: dict[Priority, int], max_batch_size: int, share: float, chosen: dict[Priority, int]
) -> None:
    """Each lower class with waiting items gets its share of every batch, at least one item."""
    clock, queue = FakeClock(), new_queue()
    for priority, count in waiting.items():
        queue.push(make_items([5] * count, now=clock(), priority=priority))
    batch = formed(queue, clock(), limits(max_batch_size=max_batch_size, lower_class_share=share))
    assert Counter(i.priority for i in batch.items) == chosen


def test_versions_never_share_a_batch() -> None:
    """Items preprocessed by different model versions are batched separately."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5, 5], now=clock(), group="v1"))
    queue.push(make_items([5, 5], now=clock(), group="v2"))
    batch = formed(queue, clock(), limits())
    assert len({i.group for i in batch.items}) == 1


def test_full_bucket_goes_before_the_delay() -> None:
    """A bucket holding a full batch dispatches even while another bucket still waits."""
    clock, queue = FakeClock(), new_queue()
    policy = FixedBuckets([8, 64])
    queue.push(make_items([50], now=clock(), bucket_of=policy.bucket_of))
    queue.push(make_items([5] * 4, now=clock(), bucket_of=policy.bucket_of))
    batch = formed(queue, clock(), limits())
    assert [i.length for i in batch.items] == [5, 5, 5, 5]


def test_neighbouring_buckets_top_up_a_batch_above_the_efficiency_floor() -> None:
    """A bucket that cannot fill the batch takes near-length neighbours, never far ones."""
    clock, queue = FakeClock(), new_queue()
    policy = FixedBuckets([8, 10, 64])
    queue.push(make_items([7, 8], now=clock(), bucket_of=policy.bucket_of))
    queue.push(make_items([9, 10], now=clock(), bucket_of=policy.bucket_of))
    queue.push(make_items([60], now=clock(), bucket_of=policy.bucket_of))
    clock.advance(0.011)
    strict = limits(max_batch_size=8, min_padding_efficiency=0.85)
    batch = formed(queue, clock(), strict)
    assert sorted(i.length for i in batch.items) == [7, 8, 9, 10]
    assert batch.real_tokens / batch.padded_tokens >= 0.85
    assert len(queue) == 1


def test_efficiency_floor_of_one_keeps_buckets_strict() -> None:
    """With the floor at 1.0 no neighbour joins, even an equal-length one."""
    clock, queue = FakeClock(), new_queue()
    policy = FixedBuckets([8, 10, 64])
    queue.push(make_items([7], now=clock(), bucket_of=policy.bucket_of))
    queue.push(make_items([9], now=clock(), bucket_of=policy.bucket_of))
    clock.advance(0.011)
    batch = formed(queue, clock(), limits(min_padding_efficiency=1.0))
    assert [i.length for i in batch.items] == [7]


def test_busy_executor_holds_a_partial_batch_until_it_is_needed() -> None:
    """While the device is busy, a partial batch waits for `not_before`, then goes."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5, 6], now=clock()))
    clock.advance(0.05)
    busy_until = clock() + 0.1
    held = plan_batch(queue, clock(), limits(), not_before=busy_until)
    assert held.batch is None
    assert held.wake_at == pytest.approx(busy_until)
    clock.advance(0.1)
    batch = formed(queue, clock(), limits(), not_before=busy_until)
    assert len(batch.items) == 2


def test_busy_executor_still_takes_a_full_bucket() -> None:
    """A full bucket is dispatched (and prepared) even while the device is busy."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5] * 4, now=clock()))
    batch = formed(queue, clock(), limits(), not_before=clock() + 1)
    assert len(batch.items) == 4


def test_an_urgent_item_is_not_starved_by_a_bucket_that_stays_full() -> None:
    """A high item in a partial bucket outranks a low bucket that keeps refilling."""
    clock, queue = FakeClock(), new_queue()
    policy = FixedBuckets([8, 64])
    queue.push(make_items([50], now=clock(), priority=Priority.HIGH, bucket_of=policy.bucket_of))
    for _ in range(3):
        queue.push(
            make_items([5] * 4, now=clock(), priority=Priority.LOW, bucket_of=policy.bucket_of)
        )
        clock.advance(0.02)
        held = plan_batch(queue, clock(), limits(), not_before=clock() + 1)
        assert held.batch is None, "busy: the urgent partial bucket waits for the executor"
        batch = formed(queue, clock(), limits())
        if any(i.priority is Priority.HIGH for i in batch.items):
            return
    pytest.fail("the high-priority item never got a batch")


def test_token_budget_does_not_let_shares_crowd_out_the_most_urgent() -> None:
    """The most urgent item goes in first; a class whose next item breaks the budget closes."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([200], now=clock(), priority=Priority.HIGH))
    queue.push(make_items([100, 100, 100], now=clock(), priority=Priority.LOW))
    clock.advance(0.011)
    tight = limits(max_batch_tokens=600, lower_class_share=0.5)
    batch = formed(queue, clock(), tight)
    assert batch.items[0].priority is Priority.HIGH
    assert batch.padded_tokens <= 600


def test_learned_buckets_follow_observed_quantiles() -> None:
    """After `refresh` observations, edges sit at quantiles of what was seen."""
    policy = LearnedBuckets(256, refresh=100)
    assert policy.edges[-1] == 256
    for i in range(100):
        policy.observe(5 + i % 20)
    edges = policy.edges
    assert edges[-1] == 256
    assert all(5 <= e <= 24 for e in edges[:-1])
    assert policy.bucket_of(5) == 0
    assert policy.bucket_of(300) == len(edges) - 1


@pytest.mark.parametrize(
    ("setting", "edges"),
    [
        pytest.param("auto", [8, 16, 32, 64, 128], id="auto"),
        pytest.param("none", [128], id="none"),
        pytest.param([16, 32], [16, 32, 128], id="explicit"),
    ],
)
def test_bucket_policy_factory(setting: str | list[int], edges: list[int]) -> None:
    """`auto` starts at powers of two from 8; `none` is one bucket; explicit edges end at max."""
    assert make_bucket_policy(setting, 128).edges == edges


def test_bucket_policy_factory_rejects_unknown() -> None:
    """An unknown setting is an error, not a silent default."""
    with pytest.raises(ValueError, match="unknown buckets"):
        make_bucket_policy("sometimes", 128)


def test_quantile_edges_are_sorted_and_capped() -> None:
    """Edges are unique, ascending, and end at the maximum length."""
    assert quantile_edges([1, 2, 3, 4, 500], (0.5, 0.99), 256) == [3, 256]


def test_learned_buckets_relearn_at_doubling_counts_then_every_refresh() -> None:
    """Edges are learned after 64 inputs, at doubling counts up to a gap of 512, then every 512."""
    policy = LearnedBuckets(4096)
    relearned = []
    for length in range(1, 2100):
        before = policy.edges
        policy.observe(length)
        if policy.edges != before:
            relearned.append(length)
    assert relearned == [64, 128, 256, 512, 1024, 1536, 2048]


def test_learned_buckets_learn_from_the_latest_window_of_lengths() -> None:
    """Past `window` (4096) inputs, edges come from the latest 4096 lengths only."""
    policy = LearnedBuckets(8192)
    lengths = list(range(1, 4609))  # 4608 is a re-learning count (every 512 after 1536)
    for length in lengths:
        policy.observe(length)
    assert policy.edges == quantile_edges(lengths[-4096:], LearnedBuckets.QUANTILES, 8192)


def test_learned_buckets_window_replaces_the_oldest_length_first() -> None:
    """A full window drops its oldest length for each new one, as a ring."""
    policy = LearnedBuckets(1000, window=4, refresh=1, first=1)
    lengths = [400, 1, 2, 3, 5, 6, 7, 8, 900]
    for seen, length in enumerate(lengths, start=1):
        policy.observe(length)
        latest = lengths[max(0, seen - 4) : seen]
        assert policy.edges == quantile_edges(latest, LearnedBuckets.QUANTILES, 1000), seen


def test_a_queue_emptied_by_expiry_plans_nothing_and_needs_no_wake_up() -> None:
    """When every item expired, they all come back and nothing is left to wake up for."""
    clock, queue = FakeClock(), new_queue()
    items = make_items([5, 6], now=clock(), timeout_s=0.005)
    queue.push(items)
    plan = plan_batch(queue, clock.advance(0.01), limits())
    assert plan.batch is None
    assert plan.expired == tuple(items)
    assert plan.wake_at is None


def test_expired_items_come_back_while_the_rest_waits() -> None:
    """Expiry is reported even when no batch is formed yet."""
    clock, queue = FakeClock(), new_queue()
    stale = make_items([5], now=clock(), timeout_s=0.005)
    queue.push(stale)
    clock.advance(0.006)
    queue.push(make_items([6], now=clock()))
    plan = plan_batch(queue, clock(), limits())
    assert plan.batch is None
    assert plan.expired == tuple(stale)
    assert plan.wake_at == pytest.approx(clock() + 0.010)


def test_a_busy_hold_reports_expiry_and_wakes_for_an_earlier_deadline() -> None:
    """While the device is busy, a waiting item's deadline before `not_before` sets the wake-up."""
    clock, queue = FakeClock(), new_queue()
    stale = make_items([5], now=clock(), timeout_s=0.005)
    waiting = make_items([6], now=clock(), timeout_s=0.5)
    queue.push(stale + waiting)
    clock.advance(0.02)
    plan = plan_batch(queue, clock(), limits(), not_before=clock() + 1)
    assert plan.batch is None
    assert plan.expired == tuple(stale)
    assert plan.wake_at == pytest.approx(waiting[0].deadline)


def test_busy_executor_holds_a_fresh_partial_batch_past_the_delay() -> None:
    """Busy until after the delay ends: a fresh partial batch waits for `not_before`."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5, 6], now=clock()))
    busy_until = clock() + 0.1
    held = plan_batch(queue, clock(), limits(), not_before=busy_until)
    assert held.batch is None
    assert held.wake_at == pytest.approx(busy_until)


def test_a_partial_batch_goes_exactly_at_the_delay() -> None:
    """The oldest item having waited exactly max_queue_delay is enough."""
    queue = new_queue()
    items = make_items([5, 6], now=FakeClock()())
    queue.push(items)
    lim = limits()
    batch = formed(queue, items[0].enqueued_at + lim.max_queue_delay_s, lim)
    assert batch.items == tuple(items)


def test_a_full_bucket_counts_one_class_better_not_more() -> None:
    """A full low bucket ranks as normal: a normal item aged half a class goes first."""
    clock, queue = FakeClock(), new_queue()
    policy = FixedBuckets([8, 64])
    queue.push(make_items([50], now=clock(), bucket_of=policy.bucket_of))
    clock.advance(0.1)  # half a class at aging_s=0.2
    queue.push(make_items([5] * 4, now=clock(), priority=Priority.LOW, bucket_of=policy.bucket_of))
    batch = formed(queue, clock(), limits())
    assert [i.length for i in batch.items] == [50]


def test_top_up_takes_the_nearest_bucket_first() -> None:
    """With room for one more, the adjacent bucket's item joins, not a farther one's."""
    clock, queue = FakeClock(), new_queue()
    policy = FixedBuckets([4, 8, 12, 16])
    queue.push(make_items([12], now=clock(), priority=Priority.HIGH, bucket_of=policy.bucket_of))
    queue.push(make_items([4], now=clock(), bucket_of=policy.bucket_of))
    queue.push(make_items([8], now=clock(), bucket_of=policy.bucket_of))
    clock.advance(0.011)
    loose = limits(max_batch_size=2, min_padding_efficiency=0.5)
    batch = formed(queue, clock(), loose)
    assert [i.length for i in batch.items] == [12, 8]


def test_top_up_takes_a_neighbouring_bucket_by_priority() -> None:
    """Within a neighbouring bucket, the better class joins first, whichever queued first."""
    clock, queue = FakeClock(), new_queue()
    policy = FixedBuckets([8, 16])
    chosen = make_items([16, 16], now=clock(), priority=Priority.HIGH, bucket_of=policy.bucket_of)
    queue.push(chosen)
    clock.advance(0.011)
    queue.push(make_items([8], now=clock(), priority=Priority.LOW, bucket_of=policy.bucket_of))
    queue.push(make_items([7], now=clock(), priority=Priority.HIGH, bucket_of=policy.bucket_of))
    loose = limits(max_batch_size=3, min_padding_efficiency=0.5)
    batch = formed(queue, clock(), loose)
    assert [i.length for i in batch.items] == [16, 16, 7]


def test_a_batch_exactly_at_the_token_budget_is_allowed() -> None:
    """max_batch_tokens is inclusive: four rows of five tokens fit a budget of 20."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5] * 4, now=clock()))
    batch = formed(queue, clock(), limits(max_batch_tokens=20))
    assert len(batch.items) == 4
    assert batch.padded_tokens == 20


def test_shares_never_overfill_a_batch() -> None:
    """When the most urgent item and the shares exceed max_batch_size, the batch stays full."""
    clock, queue = FakeClock(), new_queue()
    for priority in (Priority.HIGH, Priority.NORMAL, Priority.LOW):
        queue.push(make_items([5], now=clock(), priority=priority))
    clock.advance(0.011)
    batch = formed(queue, clock(), limits(max_batch_size=2, lower_class_share=0.5))
    assert [i.priority for i in batch.items] == [Priority.HIGH, Priority.NORMAL]


def test_efficiency_floor_of_one_excludes_an_equal_length_neighbour() -> None:
    """An item of the same length in another bucket (edges re-learned since) does not join."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([7], now=clock()))
    queue.push(make_items([7], now=clock(), bucket_of=lambda _: 1))
    clock.advance(0.011)
    batch = formed(queue, clock(), limits(min_padding_efficiency=1.0))
    assert len(batch.items) == 1


def test_batch_carries_its_version_and_formation_time() -> None:
    """`group` is the version its items were queued under; `formed_at` the planning time."""
    clock, queue = FakeClock(), new_queue()
    queue.push(make_items([5, 5], now=clock(), group="v1"))
    queue.push(make_items([5, 5], now=clock(), group="v2"))
    batch = formed(queue, clock.advance(0.011), limits())
    assert {i.group for i in batch.items} == {batch.group}
    assert batch.group in {"v1", "v2"}
    assert batch.formed_at == clock()
