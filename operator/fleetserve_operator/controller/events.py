"""Events posted off the reconcile path, in order, by one thread.

An Event is a note for people (`kubectl describe`), never read back by the operator, and
posting one already never fails a reconcile (`kube.post_event` logs a failure). Creating a
service posted six of them, one round trip each, while its reconcile held a worker; on a
loaded API server that was a quarter of the reconcile's time. `EventPoster` queues them and
one thread posts them in the order they came. The queue is bounded: past `capacity` notes
waiting (the API server is down), a new one is dropped with a warning, as a failed post is.

The Events were still the largest share of the operator's requests (about 10 per created
service, one each for every child created and every transition) and of its CPU (each a TLS
round trip). Notes of one service with the same type and reason that are queued one after
the other, as a reconcile's "Created Deployment …", "Created Service …" are, become one
Event whose message joins theirs with "; " (`merged`), as long as it fits the message
limit: a service's creation posts one "Created" Event instead of one per child.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from fleetserve_operator.controller.kube import ObjectRef
from fleetserve_operator.errors import MESSAGE_LIMIT
from fleetserve_operator.records import EventNote

__all__ = ["EventPoster", "merged"]

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
            waiting: list[_Note | None] = [item]
            while waiting[-1] is not None and not self._notes.empty():
                waiting.append(self._notes.get_nowait())
            for ref, note in merged([note for note in waiting if note is not None]):
                self._post(ref, note)
            if waiting[-1] is None:
                return


_JOINT = "; "


def merged(notes: list[_Note]) -> list[_Note]:
    """`notes` in order, each run of one service's notes of one type and reason as one note.

    Its message joins theirs with "; " while that fits `MESSAGE_LIMIT`; a note that would
    not fit starts a new one.
    """
    out: list[_Note] = []
    for ref, note in notes:
        if out:
            last_ref, last = out[-1]
            joined = f"{last.message}{_JOINT}{note.message}"
            fits = len(joined) <= MESSAGE_LIMIT
            if fits and (last_ref, last.type, last.reason) == (ref, note.type, note.reason):
                out[-1] = (ref, EventNote(note.type, note.reason, joined))
                continue
        out.append((ref, note))
    return out
