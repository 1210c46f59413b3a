"""Stop strings over streamed text: release what cannot be part of a stop, cut at the first stop.

Pure (no torch, no asyncio, no threads). Text arrives in deltas as tokens decode; a stop
string may span deltas, so the matcher holds back the longest tail of the text that is
still the beginning of some stop string, and releases it only when the next delta shows it
is not. On a match the output ends just before the stop string, which is never emitted.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["StopMatcher"]


class StopMatcher:
    """Feeds deltas through the stop strings of one sequence."""

    def __init__(self, stops: Iterable[str]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._longest = max((len(stop) for stop in self._stops), default=0)
        self._held = ""
        self.stopped = False
        """A stop string was found; everything after it is dropped."""

    def push(self, delta: str) -> str:
        """The text of `delta` (after what was held) that is safe to emit now."""
        if self.stopped:
            return ""
        if not self._stops:
            return delta
        text = self._held + delta
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What is still held back, at the end of the stream (it never became a stop)."""
        held, self._held = self._held, ""
        return held

    def _first_stop(self, text: str) -> int | None:
        # Only a stop that ends in the new text can be new, so the search starts where that
        # is possible; the held text alone never contains a whole stop.
        start = max(0, len(self._held) - self._longest + 1)
        found = [pos for stop in self._stops if (pos := text.find(stop, start)) >= 0]
        return min(found) if found else None

    def _partial_tail(self, text: str) -> int:
        """Length of the longest tail of `text` that begins some stop string."""
        for size in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[len(text) - size :]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0
