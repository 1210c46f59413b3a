"""kopf registration: which events reach the operator, and how errors become retries.

Every trigger funnels into `Sync.run` (sync.py): on create, update and resume of an
InferenceService (kopf handlers, which kopf retries on error); on the one resync lane
(`Resyncer`, not a kopf timer per object); on a faster rollout timer while a rollout runs or
the fallback carries the traffic (steps fall due by the clock); and on any event of a child
or pod the operator manages, so a deleted or edited child is restored and status follows pod
readiness and failures (a crash loop changes no Deployment). Child events do not go through
kopf, which would keep a worker and an event queue per watched object: `child_watch` reduces
each to its InferenceService's key in a deduplicating `WorkQueue`, and `QueueWorkers` threads
reconcile the keys (`Sync.run_by_name`). The same queue carries every other trigger, each
in its lane (`workqueue.Lane`): kopf's create and update handlers queue their service in
the change lane and wait for its reconcile (so kopf's retries work as before), its resume
handler (a new leader's replay) in the resync lane without waiting, the rollout timer in
the event lane, and the resync lane queues each service in turn; a
change is therefore never behind a round of resyncs, and behind the echoes or ticks of a
rollout only by the event lane's bounded share (`WorkQueue`'s `changes_per_event`).
The watches and workers start and stop with kopf (its startup and cleanup activities), so
only the leader runs them. Every watch event of an InferenceService is stored in the
`ServiceCache` that reconciles read it from (kopf runs this event handler before the change
handlers of the same event). A DELETED one also calls `Sync.forget`, to drop the service's
gauges, and takes the service off the resync lane (Kubernetes deletes the children by their
owner references).
Handlers that reconcile await the queue on kopf's event loop, or run in a thread where
there is no queue (the `kubernetes` client blocks). Domain errors are turned into kopf's
retry policy here, in `_kopf_error`, and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import kopf

from fleetserve_operator import naming
from fleetserve_operator.controller.child_watch import ChildWatches
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.controller.workqueue import Lane, WorkQueue
from fleetserve_operator.errors import ClusterUnavailable, FleetserveError, InvalidSpec, SpecError
from fleetserve_operator.spec import ConditionType, InferenceServiceStatus

__all__ = ["QueueWorkers", "Resyncer", "register"]

logger = logging.getLogger(__name__)

Key = tuple[str, str]


def _kopf_error(
    error: FleetserveError, *, delay_s: float
) -> kopf.PermanentError | kopf.TemporaryError:
    """Only a new spec fixes an invalid one; anything else may heal (a PVC appears), so retry."""
    if isinstance(error, InvalidSpec):
        return kopf.PermanentError(str(error))
    return kopf.TemporaryError(str(error), delay=delay_s)


def _is_ticking(status: kopf.Status, **_: Any) -> bool:
    """Whether the rollout timer runs: a rollout is active or the fallback serves."""
    current = InferenceServiceStatus.model_validate(dict(status))
    fallback = current.condition(ConditionType.FALLBACK_ACTIVE)
    active = current.current_phase.is_rollout_active
    return active or (fallback is not None and fallback.is_true)


class Resyncer:
    """One resync lane for every InferenceService, where kopf would run a timer per object.

    The resync re-checks what no watch covers (the memory budget, PVCs) and heals missed
    events. As kopf timers, 1000 services created together resync together: a burst of
    1000 reconciles every interval that takes every worker thread, so a spec change waits
    behind it, and an asyncio task per object besides. This lane visits the services one at
    a time on its own thread, evenly spread over the interval (`interval_s` / count apart),
    so it never holds more than one worker's worth of the API server or of the operator.
    A service is first visited about one interval after it is seen. A failed visit is
    logged and the service is visited again in the next round.

    `wait(seconds)` returns True when the lane is to stop (`threading.Event.wait`).
    `enqueue`, when given, queues a visit in the work queue's resync lane instead of
    reconciling on this thread (`QueueWorkers.resync`): the queue then decides when it runs,
    after every change and child event waiting.
    """

    def __init__(
        self,
        sync: Sync,
        *,
        interval_s: float,
        wait: Callable[[float], bool] | None = None,
        enqueue: Callable[[Key], None] | None = None,
    ) -> None:
        self._sync = sync
        self._enqueue = enqueue
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._wait = wait or self._stopping.wait
        self._services: set[tuple[str, str]] = set()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def track(self, namespace: str, name: str) -> None:
        """Visit this service from the next round on."""
        with self._guard:
            self._services.add((namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        """Stop visiting this service (it was deleted)."""
        with self._guard:
            self._services.discard((namespace, name))

    def start(self, **_: Any) -> None:
        """Start the lane's thread (kopf's startup activity)."""
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="resync", daemon=True)
        self._thread.start()

    def stop(self, **_: Any) -> None:
        """Stop the lane; a visit under way finishes first (kopf's cleanup activity)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)

    def _run(self) -> None:
        while not self.run_round():
            pass

    def run_round(self) -> bool:
        """Visit every tracked service once, spread over the interval; True when stopping."""
        with self._guard:
            services = sorted(self._services)
        if not services:
            return self._wait(self._interval_s)
        pace_s = self._interval_s / len(services)
        for namespace, name in services:
            if self._wait(pace_s):
                return True
            with self._guard:
                if (namespace, name) not in self._services:
                    continue  # deleted during this round
            self._visit(namespace, name)
        return False

    def _visit(self, namespace: str, name: str) -> None:
        if self._enqueue is not None:
            self._enqueue((namespace, name))
            return
        try:
            self._sync.run_by_name(namespace, name, trigger="resync")
        except Exception:
            # The lane must outlive any one service: it is what heals all of them.
            logger.exception("resync of %s/%s failed; retried next round", namespace, name)


@dataclass(frozen=True, slots=True)
class _Waiter:
    """A kopf handler waiting for the reconcile of its service that starts after it asked.

    `result` holds the reconcile's spec error, or the exception it raised.
    """

    trigger: str
    result: Future[SpecError | None] = field(default_factory=Future)


class QueueWorkers:
    """Threads that take InferenceService keys from a `WorkQueue` and reconcile them.

    A child event's key waits `event_delay_s` before it may run (`WorkQueue.add_after`); one
    added while it is already queued or waiting is merged, and counted as a coalesced reconcile
    (`fleetserve_operator_reconciles{trigger="child",result="coalesced"}`); the queue's
    depth is exported as `fleetserve_operator_work_queue_depth`, the reconciles running as
    `fleetserve_operator_reconciles_in_flight`. A failed reconcile is
    logged (a traceback only for an unexpected error): child events and resyncs are not
    retried, the resync lane heals what one could not. A change (`run_change`) is the
    exception: its caller, a kopf handler, gets the result and kopf retries.
    """

    def __init__(
        self, sync: Sync, metrics: OperatorMetrics, *, workers: int, event_delay_s: float = 0.0
    ) -> None:
        self._sync = sync
        self._metrics = metrics
        self._workers = workers
        self._event_delay_s = event_delay_s
        self.queue: WorkQueue[Key] = WorkQueue()
        metrics.queue_depth.set_function(lambda: len(self.queue))
        metrics.reconciles_in_flight.set_function(self.queue.running)
        self._threads: list[threading.Thread] = []
        self._waiters: dict[Key, list[_Waiter]] = {}
        """Handlers waiting for the next run of each key."""
        self._guard = threading.Lock()

    def add(self, key: Key) -> None:
        """Queue a reconcile of `key` (an InferenceService's namespace and name) for an event.

        It waits `event_delay_s` first, so that the rest of a burst of events merges into it.
        """
        if not self.queue.add_after(key, Lane.EVENT, self._event_delay_s):
            self._metrics.reconciles.labels("child", "coalesced").inc()

    def resync(self, key: Key) -> None:
        """Queue `key` in the resync lane (the `Resyncer`'s visit)."""
        self.queue.add(key, Lane.RESYNC)

    def submit_change(
        self, key: Key, *, trigger: str, lane: Lane = Lane.CHANGE
    ) -> Future[SpecError | None]:
        """Queue `key` in `lane` (the change lane: ahead of the echoes and resyncs queued).

        The reconcile that serves it starts after this call (it reads the object then), so
        it sees the change the caller was told of. The future holds its spec error, or what
        it raised; `ClusterUnavailable` when the workers stopped first.
        """
        waiter = _Waiter(trigger)
        with self._guard:
            self._waiters.setdefault(key, []).append(waiter)
        self.queue.add(key, lane)
        if self.queue.stopping:
            self._release(key, waiter)
        return waiter.result

    def resume(self, key: Key) -> None:
        """Queue `key` in the resync lane for kopf's resume, without waiting for its reconcile.

        kopf handles one object's events one at a time: a resume handler awaiting its
        reconcile, behind a new leader's replay of the whole fleet, would hold back the
        user's change to that very object until the replay reached it. The replay is a full
        resync's worth of reconciles, so it goes where resyncs go, one at a time: in the
        event lane it held every worker (and the interpreter kopf's event loop needs to
        reach the changed objects in its initial listing), and a change made during a
        hand-over waited for both. A failure is logged (the resync lane heals it), as for
        a child event.
        """
        self._submit_unwaited(key, trigger="resume", lane=Lane.RESYNC)

    def change(self, key: Key) -> None:
        """Queue `key` in the change lane, unwaited, for a spec change `service_watch` saw.

        kopf's update handler, which does wait, may come much later. A spec error is in
        status; a failure is logged, as for a resume.
        """
        self._submit_unwaited(key, trigger="update", lane=Lane.CHANGE)

    def _submit_unwaited(self, key: Key, *, trigger: str, lane: Lane) -> None:
        submitted = self.submit_change(key, trigger=trigger, lane=lane)

        def log_failure(done: Future[SpecError | None]) -> None:
            error = done.exception()
            if isinstance(error, Exception) and not self.queue.stopping:
                _log_failure(key, trigger, error)

        submitted.add_done_callback(log_failure)

    def run_change(self, key: Key, *, trigger: str) -> SpecError | None:
        """`submit_change`, then wait for its reconcile; returns its spec error or raises."""
        return self.submit_change(key, trigger=trigger).result()

    def _release(self, key: Key, waiter: _Waiter) -> None:
        """Fail a waiter the stopped queue will never serve."""
        with self._guard:
            waiting = self._waiters.get(key, [])
            if waiter not in waiting:
                return
            waiting.remove(waiter)
        _settle(waiter.result, ClusterUnavailable("the operator is stopping"))

    def start(self, **_: Any) -> None:
        """Start the worker threads (kopf's startup activity)."""
        self._threads = [
            threading.Thread(target=self._run, name=f"queue-worker-{i}", daemon=True)
            for i in range(self._workers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, **_: Any) -> None:
        """Stop taking keys; reconciles under way finish first (kopf's cleanup activity).

        A handler still waiting for a change is answered with `ClusterUnavailable`.
        """
        self.queue.stop()
        for thread in self._threads:
            thread.join(timeout=30.0)
        with self._guard:
            waiting = [(key, w) for key, ws in self._waiters.items() for w in ws]
        for key, waiter in waiting:
            self._release(key, waiter)

    def _run(self) -> None:
        while self.run_one():
            pass

    def run_one(self) -> bool:
        """Reconcile the next key (waiting for one); False once the queue is stopped."""
        taken = self.queue.take()
        if taken is None:
            return False
        key, lane = taken
        with self._guard:
            waiters = self._waiters.pop(key, [])
        trigger = waiters[0].trigger if waiters else _LANE_TRIGGERS[lane]
        outcome: SpecError | Exception | None = ClusterUnavailable("the reconcile was cut short")
        try:
            outcome = self._sync.run_by_name(*key, trigger=trigger)
        except Exception as exc:
            outcome = exc
            if not waiters:
                _log_failure(key, trigger, exc)
        finally:
            for waiter in waiters:
                _settle(waiter.result, outcome)
            self.queue.done(key)
        return True


def _settle(result: Future[SpecError | None], outcome: SpecError | Exception | None) -> None:
    """Hand a waiting handler its reconcile's spec error, or what the reconcile raised.

    A handler kopf cancelled (the operator stopping) has cancelled its future: nothing to do.
    """
    try:
        if isinstance(outcome, SpecError) or outcome is None:
            result.set_result(outcome)
        else:
            result.set_exception(outcome)
    except InvalidStateError:
        pass


_LANE_TRIGGERS = {Lane.CHANGE: "update", Lane.EVENT: "child", Lane.RESYNC: "resync"}
"""The `trigger` label of a reconcile no kopf handler waits for, by the lane it came from.

A change-lane run without a waiter is the one more run of a key changed while it ran, whose
handler the running reconcile already answered: an update."""


def _log_failure(key: Key, trigger: str, exc: Exception) -> None:
    """Log a reconcile no one waits for: the resync lane heals what it could not."""
    what = "resync of" if trigger == "resync" else "re-converging"
    event = {"resync": "visit", "resume": "resume", "update": "spec change"}.get(
        trigger, "child event"
    )
    if isinstance(exc, FleetserveError):
        logger.warning("%s %s/%s after a %s failed: %s", what, *key, event, exc)
    else:
        # A bug, not the cluster: logged in full, and the worker outlives it.
        logger.error("%s %s/%s after a %s failed", what, *key, event, exc_info=exc)


@dataclass(frozen=True, eq=False)
class Handlers:
    """The handler functions, bound to one `Sync` and its `Resyncer`.

    `retry_delay_s`: how long kopf waits before it retries a handler that raised a
    temporary error.
    """

    sync: Sync
    _: KW_ONLY
    retry_delay_s: float
    resyncer: Resyncer
    workers: QueueWorkers | None = None
    services: ServiceCache | None = None

    async def service_changed(self, body: kopf.Body, reason: str, **_: Any) -> None:
        """Converge and report on create, update and resume of an InferenceService.

        Through the work queue's change lane when there is one: ahead of every queued echo
        and resync, and never at the same time as another reconcile of the service. A
        resume is no change: a new leader resumes every service at once, and a user's change
        must not wait behind all of them, so resumes go in the resync lane, and are not
        waited for (`QueueWorkers.resume`). A change is awaited on kopf's event
        loop, holding none of kopf's worker threads: those also run every InferenceService's
        event handler, and a change handler blocked in one of them would delay the changes
        behind it.
        """
        meta = body["metadata"]
        trigger = str(reason)
        key = (meta["namespace"], meta["name"])
        try:
            if self.workers is None:
                error = await asyncio.to_thread(self.sync.run, dict(body), trigger=trigger)
            elif reason == kopf.Reason.RESUME:
                self.workers.resume(key)
                return
            else:
                submitted = self.workers.submit_change(key, trigger=trigger)
                error = await asyncio.wrap_future(submitted)
        except FleetserveError as exc:
            raise _kopf_error(exc, delay_s=self.retry_delay_s) from exc
        if error is not None:
            raise _kopf_error(error, delay_s=self.retry_delay_s)

    async def rollout_tick(self, body: kopf.Body, **_: Any) -> None:
        """Timer while `_is_ticking`: a step or an analysis falls due by the clock alone.

        Through the work queue's event lane when there is one, awaited on kopf's event
        loop: 50 services in a rollout tick 10 times a second at the default interval, and
        a user's change goes ahead of them (kopf times the next tick from this one's end).
        A spec error is already in status and waits for a new spec, so only temporary
        errors are raised (and retried).
        """
        try:
            if self.workers is None:
                await asyncio.to_thread(self.sync.run, dict(body), trigger="rollout")
            else:
                meta = body["metadata"]
                key = (meta["namespace"], meta["name"])
                submitted = self.workers.submit_change(key, trigger="rollout", lane=Lane.EVENT)
                await asyncio.wrap_future(submitted)
        except FleetserveError as exc:
            raise _kopf_error(exc, delay_s=self.retry_delay_s) from exc

    async def service_event(self, body: kopf.Body, type: str | None, **_: Any) -> None:
        """Keep the resync lane's list and the `ServiceCache`; on DELETED, forget the gauges.

        Its children go by owner references. `type` is kopf's name for the watch event
        type; None on the initial listing. On kopf's event loop (it takes locks held only
        for a set or dict update), so the event of every status write costs no worker
        thread; `Sync.forget`, which may wait for a reconcile, runs in a thread.
        """
        meta = body["metadata"]
        if type == "DELETED":
            if self.services is not None:
                self.services.discard(dict(body))
            self.resyncer.forget(meta["namespace"], meta["name"])
            await asyncio.to_thread(self.sync.forget, meta["namespace"], meta["name"])
        else:
            if self.services is not None:
                self.services.store(dict(body))
            self.resyncer.track(meta["namespace"], meta["name"])

    def probe(self, **_: Any) -> int:
        """Liveness: the number of reconciles so far (kopf serves probes on /healthz)."""
        return self.sync.reconcile_count


def register(
    registry: kopf.OperatorRegistry,
    sync: Sync,
    *,
    resync_interval_s: float,
    rollout_tick_s: float,
    retry_delay_s: float,
    children: tuple[QueueWorkers, ChildWatches] | None = None,
    services: ServiceCache | None = None,
) -> None:
    """Register every handler of the operator in `registry`.

    `children`: the workers and the child watches feeding them, started and stopped with
    kopf; None registers neither (a registry inspected by tests). `services`: the cache
    the InferenceServices' watch events are stored in, for the reconciles to read.
    """
    workers = None if children is None else children[0]
    resyncer = Resyncer(
        sync,
        interval_s=resync_interval_s,
        enqueue=None if workers is None else workers.resync,
    )
    handlers = Handlers(
        sync, retry_delay_s=retry_delay_s, resyncer=resyncer, workers=workers, services=services
    )
    kopf.on.startup(id="resync-start", registry=registry)(resyncer.start)
    kopf.on.cleanup(id="resync-stop", registry=registry)(resyncer.stop)
    if children is not None:
        workers, watches = children
        # Workers first, so no event waits for one; watches stop first, so none is lost
        # into a stopped queue while the workers still run.
        kopf.on.startup(id="queue-start", registry=registry)(workers.start)
        kopf.on.startup(id="watch-start", registry=registry)(lambda **_: watches.start())
        kopf.on.cleanup(id="watch-stop", registry=registry)(lambda **_: watches.stop())
        kopf.on.cleanup(id="queue-stop", registry=registry)(workers.stop)
    # An explicit registry starts without kopf's implicit login handlers; log in the way
    # `kube` does (in-cluster service account, else $KUBECONFIG).
    kopf.on.login(id="login", registry=registry)(kopf.login_via_client)
    resource = (naming.GROUP, naming.VERSION, naming.PLURAL)
    for cause, on_change in (
        ("create", kopf.on.create),
        ("update", kopf.on.update),
        ("resume", kopf.on.resume),
    ):
        on_change(*resource, id=f"converge-on-{cause}", registry=registry)(handlers.service_changed)
    # A watch event, not an on.delete handler: it needs no finalizer and still sees an
    # object whose finalizer someone removed by hand. A reconcile that finds the object
    # going forgets it earlier.
    kopf.on.event(*resource, id="forget-on-deleted", registry=registry)(handlers.service_event)
    kopf.on.timer(
        *resource, id="rollout", interval=rollout_tick_s, when=_is_ticking, registry=registry,
    )(handlers.rollout_tick)  # fmt: skip
    kopf.on.probe(id="reconciles", registry=registry)(handlers.probe)
