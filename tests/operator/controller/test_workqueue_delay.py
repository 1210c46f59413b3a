"""Child events held back a moment, so that a burst of them costs one reconcile."""

from __future__ import annotations

import threading
import time

import pytest

from fleetserve_operator.controller.handlers import QueueWorkers
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.controller.workqueue import Lane, WorkQueue
from fleetserve_operator.testing import FakeKube, make_service

KEY = ("ns", "demo")


@pytest.mark.timeout(30)
def test_a_burst_within_the_delay_runs_once_and_not_before_the_delay() -> None:
    queue: WorkQueue[tuple[str, str]] = WorkQueue()
    assert queue.add_after(KEY, Lane.EVENT, 0.3) is True
    for _ in range(5):
        assert queue.add_after(KEY, Lane.EVENT, 0.3) is False  # merged
    assert queue.take(timeout_s=0.1) is None, "held back"
    assert len(queue) == 1
    assert queue.take(timeout_s=5.0) == (KEY, Lane.EVENT)
    queue.done(KEY)
    assert len(queue) == 0
    assert queue.take(timeout_s=0.4) is None, "the burst ran once"


@pytest.mark.timeout(30)
def test_a_change_is_not_held_back_by_a_waiting_event() -> None:
    queue: WorkQueue[tuple[str, str]] = WorkQueue()
    queue.add_after(KEY, Lane.EVENT, 60.0)
    assert queue.add(KEY, Lane.CHANGE) is False, "it was to run already"
    started = time.monotonic()
    assert queue.take(timeout_s=5.0) == (KEY, Lane.CHANGE)
    assert time.monotonic() - started < 1.0


def test_a_key_taken_out_of_its_delay_early_waits_out_its_next_delay_in_full() -> None:
    """A change ends a key's delay; the delay of its next event counts from that event."""
    now = [0.0]
    queue: WorkQueue[tuple[str, str]] = WorkQueue(clock=lambda: now[0])
    queue.add_after(KEY, Lane.EVENT, 1.0)
    queue.add(KEY, Lane.CHANGE)
    assert queue.take(timeout_s=0) == (KEY, Lane.CHANGE)
    queue.done(KEY)
    now[0] = 0.5
    queue.add_after(KEY, Lane.EVENT, 1.0)
    now[0] = 1.0
    assert queue.take(timeout_s=0) is None, "the first delay's end does not release it"
    now[0] = 1.5
    assert queue.take(timeout_s=0) == (KEY, Lane.EVENT)


@pytest.mark.timeout(30)
def test_a_steady_stream_of_events_does_not_hold_a_key_back_past_one_delay() -> None:
    queue: WorkQueue[tuple[str, str]] = WorkQueue()
    stop = threading.Event()

    def stream() -> None:
        while not stop.is_set():
            queue.add_after(KEY, Lane.EVENT, 0.3)
            time.sleep(0.02)

    feeder = threading.Thread(target=stream)
    started = time.monotonic()
    feeder.start()
    try:
        assert queue.take(timeout_s=5.0) == (KEY, Lane.EVENT)
        assert time.monotonic() - started < 1.5
    finally:
        stop.set()
        feeder.join()


@pytest.mark.timeout(30)
def test_a_burst_of_child_events_for_one_service_costs_one_reconcile() -> None:
    """Events 50 ms apart, as a Deployment's status and its pods coming up send them."""
    kube = FakeKube()
    kube.add_service(make_service())
    sync = Sync(kube, metrics=OperatorMetrics())
    workers = QueueWorkers(sync, OperatorMetrics(), workers=2, event_delay_s=0.5)
    workers.start()
    try:
        for _ in range(6):
            workers.add(KEY)
            time.sleep(0.05)
        deadline = time.monotonic() + 5.0
        while (sync.reconcile_count == 0 or len(workers.queue)) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        workers.stop()
    assert sync.reconcile_count == 1
