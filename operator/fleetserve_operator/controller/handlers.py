"""The work queue's workers, the resync lane, and the activities kopf runs.

Which events reach the operator, in which lane, and how a failed change is retried.

Every trigger funnels into `Sync.run_by_name` (sync.py) through one deduplicating
`WorkQueue`, each in its lane (`workqueue.Lane`): a create or a spec change of an
InferenceService, which the operator's own watch of them decides (`service_watch`), in the
change lane; any event of a child or pod the operator manages (`child_watch`), so a deleted
or edited child is restored and status follows pod readiness and failures, in the event
lane; a new leader's replay of every service, and the one resync lane (`Resyncer`), in the
resync lane. A change is therefore never behind a round of resyncs, and behind the echoes
or ticks of a rollout only by the event lane's bounded share (`WorkQueue`'s
`changes_per_event`). `QueueWorkers` threads reconcile the keys.

What kopf's per-object handlers did for the InferenceServices, the workers do after each
reconcile: a create or change whose reconcile failed, for any reason but an invalid spec,
is queued again after the retry delay; a service whose rollout runs or whose fallback
serves is queued again in the event lane after the rollout tick (its steps fall due by the
clock alone). kopf handles no InferenceService event any more (it decoded and processed each
one, and patched its own bookkeeping into every service); it runs the operator's process:
the startup and cleanup activities that start and stop the watches, the workers and the
resync lane (so only the leader runs them), the login and the liveness probe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

import kopf

from fleetserve_operator.controller.child_watch import ChildWatches
from fleetserve_operator.controller.metrics import COALESCED, OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.controller.workqueue import Lane, WorkQueue
from fleetserve_operator.errors import ClusterUnavailable, FleetserveError, InvalidSpec, SpecError
from fleetserve_operator.spec import ConditionType, InferenceServiceStatus

__all__ = ["QueueWorkers", "Requeue", "Resyncer", "register"]

logger = logging.getLogger(__name__)

Key = tuple[str, str]


def is_ticking(status: Mapping[str, Any]) -> bool:
    """Whether the rollout tick runs: a rollout is active or the fallback serves."""
    current = InferenceServiceStatus.model_validate(status)
    fallback = current.condition(ConditionType.FALLBACK_ACTIVE)
    active = current.current_phase.is_rollout_active
    return active or (fallback is not None and fallback.is_true)


def is_retried(outcome: SpecError | Exception | None) -> bool:
    """Whether a change whose reconcile ended with `outcome` is tried again.

    Only a new spec fixes an invalid one; anything else may heal (a PVC appears, the API
    server answers again), so it is retried.
    """
    return outcome is not None and not isinstance(outcome, InvalidSpec)


class ServiceKeys(Protocol):
    """The services the resync lane visits (`ServiceCache`)."""

    def alive(self) -> list[Key]:
        """The services alive, sorted."""
        ...

    def is_alive(self, namespace: str, name: str) -> bool:
        """Whether the service is known and not deleted."""
        ...


class Resyncer:
    """One resync lane for every InferenceService, where kopf would run a timer per object.

    The resync re-checks what no watch covers (the memory budget, PVCs) and heals missed
    events. As kopf timers, 1000 services created together resync together: a burst of
    1000 reconciles every interval that takes every worker thread, so a spec change waits
    behind it, and an asyncio task per object besides. This lane visits the services one at
    a time on its own thread, evenly spread over the interval (`interval_s` / count apart),
    so it never holds more than one worker's worth of the API server or of the operator.
    The services are those `services` holds when a round starts (the watch's cache): a
    service is first visited in the round after it is seen, and one deleted meanwhile is
    passed over. A failed visit is logged and the service is visited again in the next
    round.

    `wait(seconds)` returns True when the lane is to stop (`threading.Event.wait`).
    `enqueue`, when given, queues a visit in the work queue's resync lane instead of
    reconciling on this thread (`QueueWorkers.resync`): the queue then decides when it runs,
    after every change and child event waiting.
    """

    def __init__(
        self,
        sync: Sync,
        services: ServiceKeys,
        *,
        interval_s: float,
        wait: Callable[[float], bool] | None = None,
        enqueue: Callable[[Key], None] | None = None,
    ) -> None:
        self._sync = sync
        self._services = services
        self._enqueue = enqueue
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._wait = wait or self._stopping.wait
        self._thread: threading.Thread | None = None

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
        """Visit every service once, spread over the interval; True when stopping."""
        services = self._services.alive()
        if not services:
            return self._wait(self._interval_s)
        pace_s = self._interval_s / len(services)
        for namespace, name in services:
            if self._wait(pace_s):
                return True
            if not self._services.is_alive(namespace, name):
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
    """A caller waiting for the reconcile of its service that starts after it asked.

    `result` holds the reconcile's spec error, or the exception it raised.
    """

    trigger: str
    result: Future[SpecError | None] = field(default_factory=Future)


def _never(_key: Key) -> bool:
    return False


@dataclass(frozen=True)
class Requeue:
    """When a worker queues a key again after its reconcile (see `QueueWorkers`)."""

    retry_delay_s: float = 30.0
    """A create or change that failed (`is_retried`) is reconciled again after this long."""
    tick_s: float = 5.0
    """A service `ticking` says is ticking is reconciled again after this long."""
    ticking: Callable[[Key], bool] = _never
    """Whether a service's last known status asks for the rollout tick (`is_ticking`)."""


class QueueWorkers:
    """Threads that take InferenceService keys from a `WorkQueue` and reconcile them.

    A child event's key waits `event_delay_s` before it may run (`WorkQueue.add_after`); one
    added while it is already queued or waiting is merged, and counted as a coalesced reconcile
    (`fleetserve_operator_reconciles{trigger="child",result="coalesced"}`); the queue's
    depth is exported as `fleetserve_operator_work_queue_depth`, the reconciles running as
    `fleetserve_operator_reconciles_in_flight`. A failed reconcile is logged (a traceback
    only for an unexpected error). A create or a change whose reconcile failed is queued
    again after `requeue.retry_delay_s`; child events and resyncs are not retried: the
    resync lane heals what one could not. After every reconcile of a service for which
    `requeue.ticking` holds, its key is queued again in the event lane after
    `requeue.tick_s`, as a rollout tick; a retry takes its place, due at the sooner of the
    two.
    """

    def __init__(
        self,
        sync: Sync,
        metrics: OperatorMetrics,
        *,
        workers: int,
        event_delay_s: float = 0.0,
        requeue: Requeue = Requeue(),
    ) -> None:
        self._sync = sync
        self._metrics = metrics
        self._workers = workers
        self._event_delay_s = event_delay_s
        self._requeue = requeue
        self.queue: WorkQueue[Key] = WorkQueue()
        metrics.queue_depth.set_function(lambda: len(self.queue))
        metrics.reconciles_in_flight.set_function(self.queue.running)
        self._threads: list[threading.Thread] = []
        self._waiters: dict[Key, list[_Waiter]] = {}
        """Callers waiting for the next run of each key."""
        self._later: dict[Key, str] = {}
        """The trigger of each key queued again by a worker (a retry, a tick), for its run."""
        self._guard = threading.Lock()

    def add(self, key: Key) -> None:
        """Queue a reconcile of `key` (an InferenceService's namespace and name) for an event.

        It waits `event_delay_s` first, so that the rest of a burst of events merges into it.
        """
        if not self.queue.add_after(key, Lane.EVENT, self._event_delay_s):
            self._metrics.reconciles.labels("child", COALESCED).inc()

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

    def create(self, key: Key) -> None:
        """Queue `key` in the change lane for a service never reconciled (`service_watch`)."""
        self._submit_unwaited(key, trigger="create", lane=Lane.CHANGE)

    def change(self, key: Key) -> None:
        """Queue `key` in the change lane for a spec not converged yet (`service_watch`)."""
        self._submit_unwaited(key, trigger="update", lane=Lane.CHANGE)

    def resume(self, key: Key) -> None:
        """Queue `key` in the resync lane for a new leader's replay of a service up to date.

        The replay is a full resync's worth of reconciles, so it goes where resyncs go, one
        at a time: in the event lane it held every worker, and a change made during a
        hand-over waited for it.
        """
        self._submit_unwaited(key, trigger="resume", lane=Lane.RESYNC)

    def gone(self, key: Key) -> None:
        """Queue `key` for a deleted service: its reconcile finds it gone and drops its gauges."""
        self._submit_unwaited(key, trigger="delete", lane=Lane.EVENT)

    def _submit_unwaited(self, key: Key, *, trigger: str, lane: Lane) -> None:
        submitted = self.submit_change(key, trigger=trigger, lane=lane)

        def log_failure(done: Future[SpecError | None]) -> None:
            error = done.exception()
            if isinstance(error, Exception) and not self.queue.stopping:
                _log_failure(key, trigger, error)

        submitted.add_done_callback(log_failure)

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
            later = self._later.pop(key, None)
        trigger = waiters[0].trigger if waiters else later or _LANE_TRIGGERS[lane]
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
            self._queue_again(key, trigger, outcome)
        return True

    def _queue_again(self, key: Key, trigger: str, outcome: SpecError | Exception | None) -> None:
        """A failed change's retry, or a ticking service's next tick: whichever is due first."""
        requeue = self._requeue
        retry = trigger in _RETRIED and is_retried(outcome)
        tick = requeue.ticking(key)
        if not (retry or tick):
            return
        delay_s = min(
            delay for delay, due in ((requeue.retry_delay_s, retry), (requeue.tick_s, tick)) if due
        )
        # A retry keeps its trigger, so that it is retried again if it fails again.
        lane, again = (Lane.CHANGE, trigger) if retry else (Lane.EVENT, "rollout")
        if retry:
            logger.info("%s of %s/%s tried again in %.1f s: %s", trigger, *key, delay_s, outcome)
        with self._guard:
            self._later[key] = again
        self.queue.add_after(key, lane, delay_s)


def _settle(result: Future[SpecError | None], outcome: SpecError | Exception | None) -> None:
    """Hand a waiting caller its reconcile's spec error, or what the reconcile raised.

    A caller that cancelled its future (the operator stopping) gets nothing.
    """
    try:
        if isinstance(outcome, SpecError) or outcome is None:
            result.set_result(outcome)
        else:
            result.set_exception(outcome)
    except InvalidStateError:
        pass


_LANE_TRIGGERS = {Lane.CHANGE: "update", Lane.EVENT: "child", Lane.RESYNC: "resync"}
"""The `trigger` label of a reconcile no one queued with a trigger, by the lane it came from.

A change-lane run without one is the one more run of a key changed while it ran, whose
caller the running reconcile already answered: an update."""

_RETRIED = frozenset({"create", "update"})
"""The triggers whose failed reconcile is queued again (kopf retried their handlers)."""


def _log_failure(key: Key, trigger: str, exc: Exception) -> None:
    """Log a reconcile no one waits for: the resync lane heals what it could not."""
    what = "resync of" if trigger == "resync" else "re-converging"
    event = {
        "resync": "visit",
        "resume": "resume",
        "create": "create",
        "update": "spec change",
        "delete": "deletion",
        "rollout": "rollout tick",
    }.get(trigger, "child event")
    if isinstance(exc, FleetserveError):
        logger.warning("%s %s/%s after a %s failed: %s", what, *key, event, exc)
    else:
        # A bug, not the cluster: logged in full, and the worker outlives it.
        logger.error("%s %s/%s after a %s failed", what, *key, event, exc_info=exc)


def register(
    registry: kopf.OperatorRegistry,
    sync: Sync,
    resyncer: Resyncer,
    children: tuple[QueueWorkers, ChildWatches] | None = None,
) -> None:
    """Register what kopf runs for the operator in `registry`.

    `children`: the workers and the watches feeding them, started and stopped with kopf;
    None registers neither (a registry inspected by tests).
    """
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
    kopf.on.probe(id="reconciles", registry=registry)(lambda **_: sync.reconcile_count)
