"""Events posted off the reconcile path, in order, by one thread.

An Event is a note for people (`kubectl describe`), never read back by the operator, and
posting one already never fails a reconcile (`kube.post_event` logs a failure). Creating a
service posted six of them, one round trip each, while its reconcile held a worker; on a
loaded API server that was a quarter of the reconcile's time. `EventPoster` queues them and
one thread posts them in the order they came. The queue is bounded: past `capacity` notes
waiting (the API server is down), a new one is dropped with a warning, as a failed post is.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from fleetserve_operator.controller.kube import ObjectRef
from fleetserve_operator.records import EventNote

__all__ = ["EventPoster"]

logger = logging.getLogger(__name__)

_Note = tuple[ObjectRef, EventNote]


class EventPoster:
    """Posts Events through `post` on a thread of its own; `close` drains what is queued."""

    def __init__(self, post: Callable[[ObjectRef, EventNote], None], *, capacity: int) -> None:
        self._post = post
        self._notes: queue.Queue[_Note | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def post(self, ref: ObjectRef, note: EventNote) -> None:
        """Queue `note` on `ref`; dropped, with a warning, when the queue is full."""
        try:
            self._notes.put_nowait((ref, note))
        except queue.Full:
            logger.warning("event %s on %s dropped: too many waiting", note.reason, ref.name)

    def close(self, *, timeout_s: float) -> None:
        """Post what is queued (for at most `timeout_s`), then stop the thread."""
        try:
            self._notes.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while (item := self._notes.get()) is not None:
            self._post(*item)
