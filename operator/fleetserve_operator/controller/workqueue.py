"""A deduplicating work queue of keys (controller-runtime's design) with fair lanes.

A watch event says only "this InferenceService may need a reconcile", and a reconcile reads
everything fresh, so a key is queued at most once however many events name it: a dozen
events of a Deployment and its pods starting cost one reconcile, and the backlog is bounded
by the number of services, not by the number of events. A key is never run by two workers
at once: one added while its reconcile runs is queued again when that reconcile is `done`,
so the change that event reported is always seen, by one more run.

Keys wait in one of three lanes (`Lane`), and `get` serves them by lane, FIFO within one: a
user's change (a new `metadata.generation`) goes ahead of child-event echoes, and both go
ahead of the periodic resync. At 1000 services the resync lane alone holds up to 1000 keys
and the echoes of a rollout dozens; a change behind them would wait for all of them. The
event lane is not starved, though: after `changes_per_event` changes in a row one waiting
event key is served. A creation burst is a thousand changes (the services' creates), and
under strict priority no service reported Ready (its pods' events wait in the event lane)
until the whole burst was created; with this share the events of the services created
first keep flowing, and a change still waits behind at most one event key for every
`changes_per_event` changes ahead of it. A key queued again in a more urgent lane moves
there (it still runs once); in a less urgent one it stays where it is. The resync lane is
also rate-limited: at most `resync_in_flight` of its keys run at once, so however long it
is, it never holds more than that many workers, and a change finds one free as soon as a
single reconcile ends.

A key may also be queued after a delay (`add_after`, controller-runtime's `AddAfter`): a
service coming up sends a burst of child and pod events (its Deployment's status, each pod
through Pending, Running and Ready), and each that found its key neither queued nor running
started a reconcile of its own, 17 per service at 1000. Held back for a moment, the burst is
merged into one. A key waiting out its delay is merged like a queued one, and an `add`
without delay (a change) takes it out of waiting at once.

Pure data structure: no kopf, no Kubernetes; threads block in `get`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from enum import IntEnum
from typing import Generic, TypeVar

__all__ = ["Lane", "WorkQueue"]

K = TypeVar("K", bound=Hashable)


class Lane(IntEnum):
    """Why a key is queued; a lower value is served first."""

    CHANGE = 0
    """A user created or changed the object (a new generation)."""
    EVENT = 1
    """An event of a child or a pod (mostly echoes of the operator's own writes)."""
    RESYNC = 2
    """The periodic re-check of every service, and a new leader's resume of each."""


class WorkQueue(Generic[K]):
    """Keys waiting for a worker, each at most once, by lane; `get` blocks until one is free."""

    def __init__(
        self,
        *,
        resync_in_flight: int = 1,
        changes_per_event: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if changes_per_event < 1:
            raise ValueError(f"changes_per_event must be at least 1, not {changes_per_event}")
        self._lanes: dict[Lane, dict[K, None]] = {lane: {} for lane in Lane}
        """Queued keys of each lane, in arrival order (a dict: ordered, O(1) removal)."""
        self._again: dict[K, Lane] = {}
        """Keys added while running: queued in that lane when their run is `done`."""
        self._running: dict[K, Lane] = {}
        self._resync_in_flight = resync_in_flight
        self._resyncs_running = 0
        self._changes_per_event = changes_per_event
        self._changes_in_row = 0
        """Change-lane keys taken since the last event-lane key."""
        self._delayed: dict[K, tuple[float, Lane]] = {}
        """Keys `add_after` holds back: when each is due, and the lane it is due in."""
        self._due: list[tuple[float, int, K]] = []
        """A heap of (due, arrival, key) over `_delayed`, so a worker finds the next due key
        without a pass over every held one. An entry whose key left `_delayed` early (an
        `add` took it) is stale and dropped when it reaches the top."""
        self._arrivals = itertools.count()
        self._clock = clock
        self._stopping = False
        self._ready = threading.Condition()

    @property
    def stopping(self) -> bool:
        """Whether `stop` was called (adds are dropped, `get` returns None)."""
        return self._stopping

    def add(self, key: K, lane: Lane = Lane.EVENT) -> bool:
        """Queue `key` in `lane`; False when it was already to run (merged, nothing more to do).

        Merged into a less urgent lane, it moves to `lane`.
        """
        with self._ready:
            if self._stopping:
                return False
            held = self._delayed.pop(key, None)
            if held is not None:
                lane = min(lane, held[1])
            return self._queue(key, lane) and held is None

    def add_after(self, key: K, lane: Lane, delay_s: float) -> bool:
        """Queue `key` in `lane` once `delay_s` has passed; False when merged.

        Merged when it is already queued, running (it runs again after, as for `add`) or
        waiting out a delay of its own, which is not extended: a steady stream of events
        never holds a key back for more than one delay.
        """
        with self._ready:
            if self._stopping:
                return False
            if key in self._delayed:
                return False
            if delay_s <= 0 or key in self._running or self._lane_of(key) is not None:
                return self._queue(key, lane)
            due = self._clock() + delay_s
            self._delayed[key] = (due, lane)
            heapq.heappush(self._due, (due, next(self._arrivals), key))
            self._ready.notify()
            return True

    def _queue(self, key: K, lane: Lane) -> bool:
        """`add` under the lock, for a key not held back."""
        if key in self._running:
            waiting = self._again.get(key)
            self._again[key] = lane if waiting is None else min(waiting, lane)
            return waiting is None
        queued = self._lane_of(key)
        if queued is not None and queued <= lane:
            return False
        if queued is not None:
            del self._lanes[queued][key]
        self._lanes[lane][key] = None
        self._ready.notify()
        return queued is None

    def get(self, timeout_s: float | None = None) -> K | None:
        """The next key, now running until `done`; None once stopped or timed out."""
        taken = self.take(timeout_s)
        return None if taken is None else taken[0]

    def take(self, timeout_s: float | None = None) -> tuple[K, Lane] | None:
        """The next key and the lane it was served from (`get` with the lane)."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        with self._ready:
            self._release_due()
            while not self._stopping and self._next_lane() is None:
                now = self._clock()
                if deadline is not None and now >= deadline:
                    break
                wake = self._next_due()
                if deadline is not None:
                    wake = deadline if wake is None else min(wake, deadline)
                self._ready.wait(None if wake is None else wake - now)
                self._release_due()
            lane = None if self._stopping else self._next_lane()
            if lane is None:
                return None
            waiting = self._lanes[lane]
            key = next(iter(waiting))
            del waiting[key]
            self._running[key] = lane
            self._changes_in_row = self._changes_in_row + 1 if lane is Lane.CHANGE else 0
            if lane is Lane.RESYNC:
                self._resyncs_running += 1
            return key, lane

    def _release_due(self) -> None:
        """Queue the held-back keys whose delay has passed (the caller holds the lock)."""
        now = self._clock()
        while self._due and self._due[0][0] <= now:
            due, _, key = heapq.heappop(self._due)
            held = self._delayed.get(key)
            if held is not None and held[0] == due:
                del self._delayed[key]
                self._queue(key, held[1])

    def _next_due(self) -> float | None:
        """When the next held-back key is due (the caller holds the lock); None: none is."""
        while self._due:
            due, _, key = self._due[0]
            held = self._delayed.get(key)
            if held is not None and held[0] == due:
                return due
            heapq.heappop(self._due)
        return None

    def _lane_of(self, key: K) -> Lane | None:
        """The lane `key` is queued in, if any (the caller holds the lock)."""
        return next((lane for lane, waiting in self._lanes.items() if key in waiting), None)

    def _next_lane(self) -> Lane | None:
        """The lane whose key runs next (the caller holds the lock); None: none may run now.

        The most urgent lane with a key, but the event lane's turn after `changes_per_event`
        changes in a row.
        """
        if (
            self._lanes[Lane.EVENT]
            and self._lanes[Lane.CHANGE]
            and self._changes_in_row >= self._changes_per_event
        ):
            return Lane.EVENT
        for lane, waiting in self._lanes.items():
            if not waiting:
                continue
            if lane is Lane.RESYNC and self._resyncs_running >= self._resync_in_flight:
                return None
            return lane
        return None

    def done(self, key: K) -> None:
        """The run of `key` finished; queue it again if it was added meanwhile."""
        with self._ready:
            if self._running.pop(key, None) is Lane.RESYNC:
                self._resyncs_running -= 1
                self._ready.notify_all()  # a resync waiting for the slot may go
            lane = self._again.pop(key, None)
            if lane is not None and not self._stopping:
                self._lanes[lane][key] = None
                self._ready.notify()

    def stop(self) -> None:
        """Wake every `get` with None; later adds are dropped."""
        with self._ready:
            self._stopping = True
            self._delayed.clear()
            self._due.clear()
            self._ready.notify_all()

    def __len__(self) -> int:
        """Keys waiting to run, held back or not (not those running)."""
        with self._ready:
            return sum(map(len, self._lanes.values())) + len(self._delayed)

    def running(self) -> int:
        """Keys taken by a worker and not yet `done`."""
        with self._ready:
            return len(self._running)

    def depth(self, lane: Lane) -> int:
        """Keys waiting in `lane`."""
        with self._ready:
            return len(self._lanes[lane])
