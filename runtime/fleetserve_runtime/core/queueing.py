"""Admission to an engine's waiting queue: the queue's bound, the request's timeout, aging.

Both engines queue requests (the encoder's `RequestQueue`, the generative `Scheduler`) and
answer the same way at the door, so the rules are written once here, below both: a full
queue refuses with `QueueFull` and a retry hint (the edge turns it into 503 + Retry-After),
a timeout outside its bounds is `InvalidInput`, and a waiting request's priority class is
raised one class per aging period waited, so nothing starves. Pure: no asyncio, no
threads, no clock of its own. Whether a caller may use a priority or the server at all is
decided above the engines, in `serving.admission`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from fleetserve_runtime.core.errors import InvalidInput, QueueFull
from fleetserve_runtime.core.priority import Priority

__all__ = ["QueueBound", "aged_priority", "resolve_timeout"]

T = TypeVar("T", int, float)


@dataclass(frozen=True, slots=True)
class QueueBound:
    """The most requests (or items) a queue holds, and the retry hint a refusal carries."""

    max_size: int
    retry_after_s: float

    def check(self, waiting: int, incoming: int = 1) -> None:
        """Raise `QueueFull` unless `incoming` more fit beside the `waiting` ones."""
        if waiting + incoming > self.max_size:
            msg = (
                f"queue is full ({waiting} of {self.max_size} waiting); "
                f"retry after {self.retry_after_s:g}s"
            )
            raise QueueFull(msg, retry_after_s=self.retry_after_s)


def resolve_timeout(requested: T | None, *, default: T, maximum: T, refusal: str) -> T:
    """The timeout a request runs under: `default` when it sets none, else `requested`.

    A requested timeout must be positive and at most `maximum`, in whatever unit the API
    takes it; otherwise `InvalidInput` with `refusal` formatted with `requested` and
    `maximum` (each API words it in its own unit).
    """
    if requested is None:
        return default
    if not 0 < requested <= maximum:
        raise InvalidInput(refusal.format(requested=requested, maximum=maximum))
    return requested


def aged_priority(priority: Priority, enqueued_at: float, now: float, aging_s: float) -> float:
    """`priority` raised one class per `aging_s` waited since `enqueued_at`; lower runs first.

    `aging_s` 0 (or less) disables aging. As every request ages at the same rate, the order
    of two requests is the same at any `now`: a queue that ranks once, at arrival, may pass
    a fixed `now` (0) for every request.
    """
    if aging_s <= 0:
        return float(priority)
    return priority - (now - enqueued_at) / aging_s
