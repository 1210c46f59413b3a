"""The work queue's lanes: a user's change goes ahead of echoes and resyncs, fairly and once.

The ordering tests drive `WorkQueue` step by step (no threads); the worker tests run a real
`Sync` against `FakeKube` through `QueueWorkers`: its retries of failed changes, the rollout
tick, and the lanes of creates, changes and resumes.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from fleetserve_operator.controller.handlers import QueueWorkers, Requeue, Resyncer
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.controller.workqueue import Lane, WorkQueue
from fleetserve_operator.errors import ClusterUnavailable, InvalidSpec
from fleetserve_operator.records import Manifest
from fleetserve_operator.testing import FakeKube, make_service


def _drain(queue: WorkQueue[str]) -> list[str]:
    """Take every key that may run now, finishing each run at once."""
    taken: list[str] = []
    while (key := queue.get(timeout_s=0)) is not None:
        taken.append(key)
        queue.done(key)
    return taken


def test_a_change_goes_ahead_of_queued_echoes_and_resyncs() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for i in range(100):
        queue.add(f"resync-{i}", Lane.RESYNC)
    queue.add("echo-1", Lane.EVENT)
    queue.add("echo-2", Lane.EVENT)
    queue.add("change", Lane.CHANGE)
    taken = _drain(queue)
    assert taken[:3] == ["change", "echo-1", "echo-2"]
    assert taken[3:] == [f"resync-{i}" for i in range(100)]


def test_a_queued_key_moves_up_to_a_more_urgent_lane_and_still_runs_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a", Lane.RESYNC)
    queue.add("b", Lane.RESYNC)
    queue.add("c", Lane.EVENT)
    assert queue.add("a", Lane.CHANGE) is False  # merged, but moved
    assert _drain(queue) == ["a", "c", "b"]


def test_a_key_queued_again_in_a_less_urgent_lane_keeps_its_place() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a", Lane.EVENT)
    queue.add("b", Lane.CHANGE)
    assert queue.add("b", Lane.RESYNC) is False
    assert queue.add("a", Lane.RESYNC) is False
    assert queue.depth(Lane.RESYNC) == 0
    assert _drain(queue) == ["b", "a"]


def test_a_change_to_a_running_key_waits_for_that_run_then_goes_first() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a", Lane.EVENT)
    assert queue.get(timeout_s=0) == "a"
    queue.add("x", Lane.EVENT)
    assert queue.add("a", Lane.RESYNC) is True
    assert queue.add("a", Lane.CHANGE) is False  # merged into the re-run, made urgent
    assert queue.get(timeout_s=0) == "x"  # not "a" while it runs
    queue.done("x")
    queue.done("a")
    assert queue.take(timeout_s=0) == ("a", Lane.CHANGE)


def test_the_resync_lane_runs_one_key_at_a_time() -> None:
    """However long the lane, it holds one worker; the others stay free for changes."""
    queue: WorkQueue[str] = WorkQueue()
    for key in ("r1", "r2", "r3"):
        queue.add(key, Lane.RESYNC)
    assert queue.get(timeout_s=0) == "r1"
    assert queue.get(timeout_s=0) is None  # r2 waits for the slot
    queue.add("change", Lane.CHANGE)
    queue.add("echo", Lane.EVENT)
    assert queue.get(timeout_s=0) == "change"
    assert queue.get(timeout_s=0) == "echo"
    queue.done("r1")
    assert queue.get(timeout_s=0) == "r2"


@pytest.mark.timeout(30)
def test_a_freed_resync_slot_wakes_a_waiting_worker() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("r1", Lane.RESYNC)
    queue.add("r2", Lane.RESYNC)
    assert queue.get(timeout_s=0) == "r1"
    taken: list[str | None] = []
    worker = threading.Thread(target=lambda: taken.append(queue.get(timeout_s=10.0)))
    worker.start()
    queue.done("r1")
    worker.join(timeout=10.0)
    assert taken == ["r2"]


def test_the_event_lane_gets_one_turn_after_every_few_changes() -> None:
    """A creation burst does not starve the events of the services created first."""
    queue: WorkQueue[str] = WorkQueue(changes_per_event=3)
    for i in range(7):
        queue.add(f"create-{i}", Lane.CHANGE)
    queue.add("echo-1", Lane.EVENT)
    queue.add("echo-2", Lane.EVENT)
    queue.add("resync", Lane.RESYNC)
    assert _drain(queue) == [
        "create-0", "create-1", "create-2", "echo-1",
        "create-3", "create-4", "create-5", "echo-2",
        "create-6", "resync",
    ]  # fmt: skip


def test_a_share_below_one_change_per_event_is_refused() -> None:
    with pytest.raises(ValueError, match="changes_per_event"):
        WorkQueue(changes_per_event=0)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("changes_per_event", [1, 3])
def test_a_change_is_behind_at_most_one_echo_per_few_changes_and_never_a_resync(
    seed: int, changes_per_event: int
) -> None:
    """What a queued change may wait behind is bounded.

    Random adds, takes and finishes by 4 workers over 200 keys: while a change is queued,
    no resync is taken, and an echo only after `changes_per_event` changes in a row (so a
    change waits behind at most one echo for every `changes_per_event` changes ahead of
    it); at most one resync runs at any time.
    """
    rng = random.Random(seed)
    queue: WorkQueue[int] = WorkQueue(changes_per_event=changes_per_event)
    running: list[int] = []
    lanes: dict[int, Lane] = {}
    changes_in_row = 0
    for _ in range(3000):
        action = rng.random()
        if action < 0.45:
            key = rng.randrange(200)
            lane = rng.choice([Lane.RESYNC, Lane.RESYNC, Lane.EVENT, Lane.CHANGE])
            queue.add(key, lane)
        elif action < 0.75 and len(running) < 4:
            change_ready = queue.depth(Lane.CHANGE) > 0
            taken = queue.take(timeout_s=0)
            if taken is None:
                continue
            key, lane = taken
            if change_ready:
                assert lane is not Lane.RESYNC, "a resync went ahead of a change"
                if lane is Lane.EVENT:
                    assert changes_in_row >= changes_per_event, "an echo went ahead too soon"
            changes_in_row = changes_in_row + 1 if lane is Lane.CHANGE else 0
            lanes[key] = lane
            assert sum(lanes[k] is Lane.RESYNC for k in [*running, key]) <= 1
            running.append(key)
        elif running:
            key = running.pop(rng.randrange(len(running)))
            queue.done(key)


def _workers(
    *names: str, kube: FakeKube | None = None, count: int = 1, **requeue: Any
) -> tuple[FakeKube, QueueWorkers]:
    kube = kube or FakeKube()
    for name in names:
        kube.add_service(make_service(name=name))
    metrics = OperatorMetrics()
    workers = QueueWorkers(
        Sync(kube, metrics=metrics), metrics, workers=count, requeue=Requeue(**requeue)
    )
    return kube, workers


def _reconciles(workers: QueueWorkers, trigger: str) -> float:
    """How many reconciles `workers` ran with `trigger`, whatever their result."""
    families = workers._metrics.registry.collect()
    return sum(
        sample.value
        for family in families
        if family.name == "fleetserve_operator_reconciles"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["trigger"] == trigger
    )


@pytest.mark.parametrize("ahead", ["resync", "resume"])
def test_a_change_is_reconciled_before_the_resyncs_or_resumes_queued_ahead_of_it(
    ahead: str,
) -> None:
    """One worker serves a change before 50 resyncs, or a new leader's 50 resumes."""
    names = [f"s{i}" for i in range(50)]
    kube, workers = _workers("changed", *names)
    for name in names:
        getattr(workers, ahead)(("ns", name))
    workers.change(("ns", "changed"))
    assert workers.run_one() is True
    first_written = kube.writes[0][2]
    assert first_written.startswith("changed"), kube.writes[:3]


def test_a_change_gets_the_spec_error_of_its_reconcile() -> None:
    bad = make_service({"model": {"name": "m", "version": "1", "uri": "builtin://nope"}})
    kube = FakeKube()
    kube.add_service(bad)
    _, workers = _workers(kube=kube)
    result = workers.submit_change(("ns", "demo"), trigger="create")
    assert workers.run_one() is True
    assert isinstance(result.result(timeout=0), InvalidSpec)


class _DownKube(FakeKube):
    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        raise ClusterUnavailable(f"GET {name}: connection refused")


def test_a_change_whose_reconcile_fails_reaches_its_caller() -> None:
    _, workers = _workers(kube=_DownKube())
    result = workers.submit_change(("ns", "demo"), trigger="update")
    workers.run_one()
    failure = result.exception(timeout=0)
    assert isinstance(failure, ClusterUnavailable)
    assert "connection refused" in str(failure)


def test_a_change_waiting_when_the_workers_stop_is_answered() -> None:
    _, workers = _workers("demo")
    result = workers.submit_change(("ns", "demo"), trigger="update")
    workers.stop()
    assert isinstance(result.exception(timeout=5.0), ClusterUnavailable)


@pytest.mark.parametrize("trigger", ["create", "update"])
def test_a_failed_change_is_reconciled_again_after_the_retry_delay(trigger: str) -> None:
    """A failed create or update is tried again, with its trigger (kopf retried its handler)."""
    _, workers = _workers(kube=_DownKube(), retry_delay_s=3600.0)
    getattr(workers, "create" if trigger == "create" else "change")(("ns", "demo"))
    workers.run_one()
    assert len(workers.queue) == 1, "held back for the retry delay"
    assert workers.queue.take(timeout_s=0) is None, "not before the delay"
    _, soon = _workers(kube=_DownKube(), retry_delay_s=0.0)
    soon.submit_change(("ns", "demo"), trigger=trigger)
    soon.run_one()
    assert soon.queue.depth(Lane.CHANGE) == 1
    soon.run_one()
    assert _reconciles(soon, trigger) == 2
    assert soon.queue.depth(Lane.CHANGE) == 1, "failed again: retried again"


def test_an_invalid_spec_a_failed_child_event_and_a_failed_resync_are_not_retried() -> None:
    """Only a new spec fixes an invalid one; the resync lane heals the others."""
    bad = make_service({"model": {"name": "m", "version": "1", "uri": "builtin://nope"}})
    kube = FakeKube()
    kube.add_service(bad)
    _, workers = _workers(kube=kube, retry_delay_s=0.0)
    workers.create(("ns", "demo"))
    workers.run_one()
    assert len(workers.queue) == 0
    _, down = _workers(kube=_DownKube(), retry_delay_s=0.0)
    down.add(("ns", "demo"))
    down.run_one()
    down.resync(("ns", "demo"))
    down.run_one()
    assert len(down.queue) == 0


def test_a_ticking_service_is_reconciled_again_after_each_reconcile_until_it_stops() -> None:
    """The rollout tick: kopf ran a timer per ticking object; the queue re-queues the key."""
    ticking = {("ns", "demo")}
    _, workers = _workers("demo", tick_s=0.0, ticking=lambda key: key in ticking)
    workers.resync(("ns", "demo"))
    workers.run_one()
    assert workers.queue.depth(Lane.EVENT) == 1
    workers.run_one()
    assert _reconciles(workers, "rollout") == 1
    assert workers.queue.depth(Lane.EVENT) == 1, "still ticking"
    ticking.clear()
    workers.run_one()
    assert _reconciles(workers, "rollout") == 2
    assert len(workers.queue) == 0


def test_a_failing_ticking_service_is_retried_at_the_sooner_of_its_tick_and_the_delay() -> None:
    _, workers = _workers(
        kube=_DownKube(), retry_delay_s=3600.0, tick_s=0.0, ticking=lambda _key: True
    )
    workers.change(("ns", "demo"))
    workers.run_one()
    assert workers.queue.depth(Lane.CHANGE) == 1, "at the tick, kept a change"
    workers.run_one()
    assert _reconciles(workers, "update") == 2


def test_the_resync_lane_queues_its_visits_when_given_a_queue() -> None:
    kube, workers = _workers("a", "b")
    services = ServiceCache()
    for name in ("a", "b"):
        found = kube.get_inference_service("ns", name)
        assert found is not None
        services.store(found)
    lane = Resyncer(
        Sync(kube, metrics=OperatorMetrics()),
        services,
        interval_s=2.0,
        wait=lambda _s: False,
        enqueue=workers.resync,
    )
    lane.run_round()
    assert kube.writes == [], "queued, not reconciled on the lane's thread"
    assert workers.queue.depth(Lane.RESYNC) == 2


class _HeldKube(FakeKube):
    """Once `holding`, a reconcile of any service but `changed` waits until `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.release = threading.Event()
        self.most_held = 0
        self._held = 0
        self._lock = threading.Lock()

    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        if self.holding and name != "changed":
            with self._lock:
                self._held += 1
                self.most_held = max(self.most_held, self._held)
            self.release.wait(timeout=20.0)
            with self._lock:
                self._held -= 1
        return super().get_inference_service(namespace, name)


@pytest.mark.timeout(60)
def test_a_new_leaders_resumes_hold_one_worker_so_a_change_finds_one_free() -> None:
    """A hand-over's replay runs one reconcile at a time, however slow each is.

    Ten resumes are queued, then the reconciles of resumed services block: with three
    workers, a user's change made meanwhile is served at once, and never more than one
    resume was running. In the event lane the three workers all wait on resumes, and the
    change waits for them.
    """
    names = [f"s{i}" for i in range(10)]
    kube, workers = _workers("changed", *names, kube=_HeldKube(), count=3)
    assert isinstance(kube, _HeldKube)
    for name in names:
        workers.resume(("ns", name))
    kube.holding = True
    workers.start()
    try:
        while kube.most_held == 0:
            threading.Event().wait(0.001)
        changed = workers.submit_change(("ns", "changed"), trigger="update")
        assert changed.result(timeout=5.0) is None
        assert kube.most_held == 1
        assert kube.writes[0][2].startswith("changed"), kube.writes[:3]
    finally:
        kube.release.set()
        workers.stop()
