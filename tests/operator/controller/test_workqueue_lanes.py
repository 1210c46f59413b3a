"""The work queue's lanes: a user's change goes ahead of echoes and resyncs, fairly and once.

The ordering tests drive `WorkQueue` step by step (no threads); the worker tests run a real
`Sync` against `FakeKube` through `QueueWorkers`, as kopf's change handlers do.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import kopf
import pytest

from fleetserve_operator.controller.handlers import Handlers, QueueWorkers, Resyncer
from fleetserve_operator.controller.metrics import OperatorMetrics
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
    *names: str, kube: FakeKube | None = None, count: int = 1
) -> tuple[FakeKube, QueueWorkers]:
    kube = kube or FakeKube()
    for name in names:
        kube.add_service(make_service(name=name))
    metrics = OperatorMetrics()
    return kube, QueueWorkers(Sync(kube, metrics=metrics), metrics, workers=count)


def _waiting_change(
    workers: QueueWorkers, key: tuple[str, str] = ("ns", "demo"), trigger: str = "update"
) -> tuple[threading.Thread, list[object]]:
    """A handler thread waiting on a change of `key`, once the change is queued.

    The list gets what `run_change` returned, or the `ClusterUnavailable` it raised.
    """
    outcomes: list[object] = []

    def handle() -> None:
        try:
            outcomes.append(workers.run_change(key, trigger=trigger))
        except ClusterUnavailable as exc:
            outcomes.append(exc)

    handler = threading.Thread(target=handle)
    handler.start()
    while workers.queue.depth(Lane.CHANGE) == 0:
        threading.Event().wait(0.001)
    return handler, outcomes


@pytest.mark.timeout(30)
def test_a_change_is_reconciled_before_the_resyncs_queued_ahead_of_it() -> None:
    """Kopf's handler waits in the change lane; one worker serves it before 50 resyncs."""
    names = [f"s{i}" for i in range(50)]
    kube, workers = _workers("changed", *names)
    for name in names:
        workers.resync(("ns", name))
    handler, outcome = _waiting_change(workers, ("ns", "changed"))
    workers.start()
    handler.join(timeout=20.0)
    workers.stop()
    assert outcome == [None]
    first_written = kube.writes[0][2]
    assert first_written.startswith("changed"), kube.writes[:3]


def test_a_change_gets_the_spec_error_of_its_reconcile() -> None:
    bad = make_service({"model": {"name": "m", "version": "1", "uri": "builtin://nope"}})
    kube = FakeKube()
    kube.add_service(bad)
    _, workers = _workers(kube=kube)
    handler, results = _waiting_change(workers, trigger="create")
    assert workers.run_one() is True
    handler.join(timeout=10.0)
    assert len(results) == 1
    assert isinstance(results[0], InvalidSpec)


class _DownKube(FakeKube):
    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        raise ClusterUnavailable(f"GET {name}: connection refused")


@pytest.mark.timeout(30)
def test_a_change_whose_reconcile_fails_raises_to_its_handler() -> None:
    """Kopf must see the failure to retry it."""
    _, workers = _workers(kube=_DownKube())
    handler, failures = _waiting_change(workers)
    workers.run_one()
    handler.join(timeout=10.0)
    assert len(failures) == 1
    assert isinstance(failures[0], ClusterUnavailable)
    assert "connection refused" in str(failures[0])


@pytest.mark.timeout(30)
def test_a_change_waiting_when_the_workers_stop_is_answered() -> None:
    _, workers = _workers("demo")
    handler, failures = _waiting_change(workers)
    workers.stop()
    handler.join(timeout=10.0)
    assert not handler.is_alive()
    assert len(failures) == 1
    assert isinstance(failures[0], ClusterUnavailable)


def test_the_resync_lane_queues_its_visits_when_given_a_queue() -> None:
    kube, workers = _workers("a", "b")
    lane = Resyncer(
        Sync(kube, metrics=OperatorMetrics()),
        interval_s=2.0,
        wait=lambda _s: False,
        enqueue=workers.resync,
    )
    lane.track("ns", "a")
    lane.track("ns", "b")
    lane.run_round()
    assert kube.writes == [], "queued, not reconciled on the lane's thread"
    assert workers.queue.depth(Lane.RESYNC) == 2


def _queued_ahead_of_a_change(
    names: list[str],
    call: Callable[[Handlers, kopf.Body], Coroutine[Any, Any, None]],
    before_start: Callable[[QueueWorkers], None] = lambda workers: None,
) -> FakeKube:
    """`call` for each of `names`, then a user's change, all queued before the workers start."""
    kube, workers = _workers("changed", *names)
    sync = Sync(kube, metrics=OperatorMetrics())
    resyncer = Resyncer(sync, interval_s=60.0, enqueue=workers.resync)
    handlers = Handlers(sync, retry_delay_s=1.0, resyncer=resyncer, workers=workers)

    def body(name: str) -> kopf.Body:
        found = kube.get_inference_service("ns", name)
        assert found is not None
        return kopf.Body(found)

    async def queue_then_run() -> None:
        calls = [call(handlers, body(name)) for name in names]
        calls.append(handlers.service_changed(body=body("changed"), reason="update"))
        tasks = [asyncio.ensure_future(each) for each in calls]
        while len(workers.queue) < len(tasks):
            await asyncio.sleep(0.001)
        before_start(workers)
        workers.start()
        await asyncio.gather(*tasks)

    try:
        asyncio.run(queue_then_run())
    finally:
        workers.stop()
    return kube


@pytest.mark.timeout(60)
def test_a_new_leaders_resumes_do_not_hold_back_a_users_change() -> None:
    """Kopf resumes every service when a leader starts; an update goes ahead of them all."""
    kube = _queued_ahead_of_a_change(
        [f"s{i}" for i in range(20)],
        lambda handlers, body: handlers.service_changed(body=body, reason="resume"),
    )
    assert kube.writes[0][2].startswith("changed"), kube.writes[:3]


def test_rollout_ticks_wait_in_the_event_lane_behind_a_users_change() -> None:
    """20 services in a rollout tick: a change queued after every tick goes ahead of them."""
    names = [f"s{i}" for i in range(20)]

    def all_ticks_in_the_event_lane(workers: QueueWorkers) -> None:
        assert workers.queue.depth(Lane.EVENT) == len(names)

    kube = _queued_ahead_of_a_change(
        names,
        lambda handlers, body: handlers.rollout_tick(body=body),
        all_ticks_in_the_event_lane,
    )
    assert kube.writes[0][2].startswith("changed"), kube.writes[:3]
    assert len({name for _, _, name in kube.writes}) > len(names), "every tick reconciled"


def test_a_resume_returns_at_once_so_kopf_delivers_the_change_to_that_object() -> None:
    """A resume waiting behind a new leader's replay would hold back the change to its object.

    kopf runs one object's handlers one at a time, so the change waits for the resume.
    """
    kube, workers = _workers("changed", "other")
    sync = Sync(kube, metrics=OperatorMetrics())
    resyncer = Resyncer(sync, interval_s=60.0, enqueue=workers.resync)
    handlers = Handlers(sync, retry_delay_s=1.0, resyncer=resyncer, workers=workers)
    found = kube.get_inference_service("ns", "changed")
    assert found is not None
    workers.add(("ns", "other"))  # the replay, queued ahead; no worker runs yet

    async def resume_then_change() -> None:
        resumed = handlers.service_changed(body=kopf.Body(found), reason="resume")
        await asyncio.wait_for(resumed, timeout=2.0)
        assert workers.queue.depth(Lane.EVENT) == 1
        assert workers.queue.depth(Lane.RESYNC) == 1
        changed = asyncio.ensure_future(
            handlers.service_changed(body=kopf.Body(found), reason="update")
        )
        while workers.queue.depth(Lane.CHANGE) == 0:
            await asyncio.sleep(0.001)
        workers.start()
        await changed

    try:
        asyncio.run(resume_then_change())
    finally:
        workers.stop()
    assert kube.writes[0][2].startswith("changed"), kube.writes[:3]


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
    sync = Sync(kube, metrics=OperatorMetrics())
    resyncer = Resyncer(sync, interval_s=60.0, enqueue=workers.resync)
    handlers = Handlers(sync, retry_delay_s=1.0, resyncer=resyncer, workers=workers)
    bodies = {name: kube.get_inference_service("ns", name) for name in ["changed", *names]}

    async def resumes_then_change() -> None:
        for name in names:
            await handlers.service_changed(body=kopf.Body(bodies[name]), reason="resume")
        kube.holding = True
        workers.start()
        while kube.most_held == 0:
            await asyncio.sleep(0.001)
        changed = handlers.service_changed(body=kopf.Body(bodies["changed"]), reason="update")
        await asyncio.wait_for(changed, timeout=5.0)

    try:
        asyncio.run(resumes_then_change())
        assert kube.most_held == 1
        assert kube.writes[0][2].startswith("changed"), kube.writes[:3]
    finally:
        kube.release.set()
        workers.stop()
