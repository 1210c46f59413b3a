"""A deduplicating work queue of keys (controller-runtime's design), shared by worker threads.

A watch event says only "this InferenceService may need a reconcile", and a reconcile reads
everything fresh, so a key is queued at most once however many events name it: a dozen
events of a Deployment and its pods starting cost one reconcile, and the backlog is bounded
by the number of services, not by the number of events. Keys leave in FIFO order. A key is
never run by two workers at once: one added while its reconcile runs is queued again when
that reconcile is `done`, so the change that event reported is always seen, by one more run.

Pure data structure: no kopf, no Kubernetes; threads block in `get`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["WorkQueue"]

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys waiting for a worker, each at most once; `get` blocks until one is free."""

    def __init__(self) -> None:
        self._order: deque[K] = deque()
        self._dirty: set[K] = set()
        """Keys to run: queued in `_order`, or waiting for their running reconcile's `done`."""
        self._processing: set[K] = set()
        self._stopping = False
        self._ready = threading.Condition()

    def add(self, key: K) -> bool:
        """Queue `key`; False when it was already to run (merged, nothing more to do)."""
        with self._ready:
            if self._stopping or key in self._dirty:
                return False
            self._dirty.add(key)
            if key not in self._processing:
                self._order.append(key)
                self._ready.notify()
            return True

    def get(self, timeout_s: float | None = None) -> K | None:
        """The oldest queued key, now processing until `done`; None once stopped or timed out."""
        with self._ready:
            self._ready.wait_for(lambda: self._order or self._stopping, timeout=timeout_s)
            if self._stopping or not self._order:
                return None
            key = self._order.popleft()
            self._dirty.discard(key)
            self._processing.add(key)
            return key

    def done(self, key: K) -> None:
        """The reconcile of `key` finished; queue it again if it was added meanwhile."""
        with self._ready:
            self._processing.discard(key)
            if key in self._dirty and not self._stopping:
                self._order.append(key)
                self._ready.notify()

    def stop(self) -> None:
        """Wake every `get` with None; later adds are dropped."""
        with self._ready:
            self._stopping = True
            self._ready.notify_all()

    def __len__(self) -> int:
        """Keys waiting to run (not those running)."""
        with self._ready:
            return len(self._order)
