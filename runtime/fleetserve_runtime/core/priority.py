"""Request priority classes: which request is computed first, and which is preempted first.

Both engines schedule by it (the encoder's queue, the generative scheduler) and the edge
parses it from requests, so it sits in the core, below all of them.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Priority"]


class Priority(IntEnum):
    """Request priority classes; a lower value is served first."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, value: str) -> Priority:
        """Return the class named `value` (case-insensitive); raise `ValueError` otherwise."""
        try:
            return cls[value.strip().upper()]
        except KeyError:
            names = ", ".join(p.name.lower() for p in cls)
            msg = f"priority must be one of {names}, got {value!r}"
            raise ValueError(msg) from None
