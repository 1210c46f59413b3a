"""The deduplicating work queue, and the workers that reconcile its keys through `Sync`."""

from __future__ import annotations

import logging
import threading

import pytest

from fleetserve_operator.controller.handlers import QueueWorkers
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.controller.workqueue import WorkQueue
from fleetserve_operator.errors import ClusterUnavailable
from fleetserve_operator.records import Manifest
from fleetserve_operator.testing import FakeKube, make_service


def test_a_key_added_while_queued_is_merged() -> None:
    queue: WorkQueue[str] = WorkQueue()
    assert queue.add("a") is True
    assert queue.add("a") is False
    assert queue.add("b") is True
    assert len(queue) == 2
    assert queue.get(timeout_s=0) == "a"
    assert queue.get(timeout_s=0) == "b"
    assert queue.get(timeout_s=0) is None


def test_keys_leave_in_the_order_they_came() -> None:
    queue: WorkQueue[int] = WorkQueue()
    for key in (3, 1, 2, 1, 3):
        queue.add(key)
    taken = [queue.get(timeout_s=0) for _ in range(3)]
    assert taken == [3, 1, 2]


def test_a_key_added_during_its_run_runs_once_more_after_it() -> None:
    """Never twice at once, and the change seen meanwhile is not lost."""
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    assert queue.get(timeout_s=0) == "a"
    assert queue.add("a") is True
    assert queue.add("a") is False  # merged into the one re-run
    assert queue.get(timeout_s=0) is None  # not while its run is under way
    queue.done("a")
    assert queue.get(timeout_s=0) == "a"
    queue.done("a")
    assert queue.get(timeout_s=0) is None


def test_a_key_not_added_during_its_run_is_not_run_again() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    assert queue.get(timeout_s=0) == "a"
    queue.done("a")
    assert len(queue) == 0
    assert queue.get(timeout_s=0) is None


@pytest.mark.timeout(30)
def test_stop_wakes_a_waiting_worker_and_drops_later_adds() -> None:
    queue: WorkQueue[str] = WorkQueue()
    taken: list[str | None] = []
    worker = threading.Thread(target=lambda: taken.append(queue.get()))
    worker.start()
    queue.stop()
    worker.join(timeout=10.0)
    assert taken == [None]
    assert queue.add("a") is False
    assert queue.get(timeout_s=0) is None


class _Recorder:
    """Workers that record when each key was added and when its runs started, on one clock."""

    def __init__(self, queue: WorkQueue[int]) -> None:
        self.queue = queue
        self.guard = threading.Lock()
        self.running: set[int] = set()
        self.overlaps: list[int] = []
        self.last_added: dict[int, int] = {}
        self.last_started: dict[int, int] = {}
        self._clock = iter(range(10**9))

    def work(self) -> None:
        while (key := self.queue.get()) is not None:
            with self.guard:
                if key in self.running:
                    self.overlaps.append(key)
                self.running.add(key)
                self.last_started[key] = next(self._clock)
            with self.guard:
                self.running.discard(key)
            self.queue.done(key)

    def produce(self, offset: int) -> None:
        for i in range(2000):
            key = (i * 7 + offset) % 50
            with self.guard:
                self.last_added[key] = next(self._clock)
            self.queue.add(key)

    def caught_up(self) -> bool:
        """Idle, and every key ran after it was last added."""
        with self.guard:
            if len(self.queue) or self.running:
                return False
            return all(self.last_started.get(k, -1) > v for k, v in self.last_added.items())


@pytest.mark.timeout(60)
def test_no_key_is_lost_under_concurrent_adds_and_workers() -> None:
    """Every key's last add is followed by a run that started after it; none runs twice at once."""
    recorder = _Recorder(WorkQueue())
    workers = [threading.Thread(target=recorder.work) for _ in range(4)]
    producers = [threading.Thread(target=recorder.produce, args=(n,)) for n in range(3)]
    for thread in (*workers, *producers):
        thread.start()
    for thread in producers:
        thread.join()
    while not recorder.caught_up():
        threading.Event().wait(0.01)
    recorder.queue.stop()
    for thread in workers:
        thread.join(timeout=10.0)
    assert recorder.overlaps == []
    assert set(recorder.last_started) == set(range(50))


def _workers(*names: str) -> tuple[FakeKube, OperatorMetrics, QueueWorkers]:
    kube = FakeKube()
    for name in names:
        kube.add_service(make_service(name=name))
    metrics = OperatorMetrics()
    return kube, metrics, QueueWorkers(Sync(kube, metrics=metrics), metrics, workers=2)


def _sample(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_worker_reconciles_a_queued_service_and_counts_merged_events() -> None:
    kube, metrics, workers = _workers("demo")
    for _ in range(5):
        workers.add(("ns", "demo"))
    assert _sample(metrics, "fleetserve_operator_work_queue_depth") == 1.0
    assert _sample(metrics, "fleetserve_operator_reconciles_total", trigger="child",
                   result="coalesced") == 4.0  # fmt: skip
    assert workers.run_one() is True
    assert kube.writes, "the queued service was really reconciled"
    assert _sample(metrics, "fleetserve_operator_reconciles_total", trigger="child",
                   result="ok") == 1.0  # fmt: skip
    assert _sample(metrics, "fleetserve_operator_work_queue_depth") == 0.0


def test_the_reconciles_in_flight_are_those_taken_and_not_yet_done() -> None:
    _, metrics, workers = _workers("a", "b")
    workers.resync(("ns", "a"))
    workers.add(("ns", "b"))
    assert _sample(metrics, "fleetserve_operator_reconciles_in_flight") == 0.0
    first = workers.queue.get()
    second = workers.queue.get()
    assert first is not None
    assert second is not None
    assert _sample(metrics, "fleetserve_operator_reconciles_in_flight") == 2.0
    workers.queue.done(first)
    assert _sample(metrics, "fleetserve_operator_reconciles_in_flight") == 1.0
    workers.queue.done(second)
    assert _sample(metrics, "fleetserve_operator_reconciles_in_flight") == 0.0


@pytest.mark.timeout(30)
def test_worker_threads_start_drain_and_stop() -> None:
    kube, metrics, workers = _workers("a", "b")
    workers.start(logger=None)
    workers.add(("ns", "a"))
    workers.add(("ns", "b"))
    workers.add(("ns", "gone"))  # deleted before its turn: a "gone" reconcile, no error
    done = threading.Event()
    for _ in range(1000):
        ok = _sample(metrics, "fleetserve_operator_reconciles_total", trigger="child", result="ok")
        gone = _sample(
            metrics, "fleetserve_operator_reconciles_total", trigger="child", result="gone"
        )
        if ok == 2.0 and gone == 1.0:
            done.set()
            break
        threading.Event().wait(0.01)
    workers.stop(logger=None)
    assert done.is_set()
    assert all(not thread.is_alive() for thread in workers._threads)


class _DownKube(FakeKube):
    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        raise ClusterUnavailable(f"GET {name}: connection refused")


def test_a_failed_reconcile_is_a_warning_without_traceback_and_the_key_is_released(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cluster failing is no bug: one line, no traceback; the key may be queued again."""
    metrics = OperatorMetrics()
    workers = QueueWorkers(Sync(_DownKube(), metrics=metrics), metrics, workers=1)
    workers.add(("ns", "demo"))
    with caplog.at_level(logging.WARNING):
        assert workers.run_one() is True
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "connection refused" in record.getMessage()
    assert record.exc_info is None
    assert workers.queue.add(("ns", "demo")) is True
