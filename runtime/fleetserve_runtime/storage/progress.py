"""Progress events: `{"event": "progress", "bytes_done": N, "bytes_total": M}` as bytes arrive.

An event goes out when the count crosses a step (a hundredth of the total, at least 1 MiB;
16 MiB while the total is unknown), so a large model logs about a hundred lines, not one per
chunk. Thread-safe: parallel downloads advance one `Progress`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Emit", "Progress"]

Emit = Callable[[dict[str, object]], None]
"""Where events go (the command writes each as one JSON line on stdout)."""

_MIN_STEP = 1 << 20
_UNKNOWN_TOTAL_STEP = 16 << 20


class Progress:
    """Counts transferred bytes and emits progress events through `emit`."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._done = 0
        self._total: int | None = None
        self._next = _UNKNOWN_TOTAL_STEP
        self._lock = threading.Lock()

    def start(self, total: int | None) -> None:
        """The bytes to transfer (None: unknown); emits the first event."""
        with self._lock:
            self._total = total
            self._next = self._done + self._step()
            event = self._event()
        self._emit(event)

    def advance(self, size: int) -> None:
        """`size` more bytes transferred."""
        with self._lock:
            self._done += size
            if self._done < self._next:
                return
            self._next = self._done + self._step()
            event = self._event()
        self._emit(event)

    def finish(self) -> None:
        """Emit the final count."""
        with self._lock:
            event = self._event()
        self._emit(event)

    def _step(self) -> int:
        if self._total is None:
            return _UNKNOWN_TOTAL_STEP
        return max(_MIN_STEP, self._total // 100)

    def _event(self) -> dict[str, object]:
        return {"event": "progress", "bytes_done": self._done, "bytes_total": self._total}
