"""The byte budget (`--max-bytes`): checked against what a store declares, then enforced.

A fetcher first checks the sizes the store declares (an S3 listing, an OCI manifest's layer
sizes, a Content-Length) with `check_declared`, before any body is read; then every byte
written is charged with `charge`, which fails as soon as the total passes the limit, so a
store that declares less than it sends, or an archive that inflates, stops at the limit.
Thread-safe: parallel downloads charge one budget.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from fleetserve_runtime.storage.progress import Progress
from fleetserve_runtime.storage.reasons import FetchFailed, Reason

__all__ = ["ByteBudget", "metered"]


class ByteBudget:
    """At most `limit` bytes (None: no limit) of `what` (e.g. "the model", "the download")."""

    def __init__(self, limit: int | None, what: str) -> None:
        self.limit = limit
        self.what = what
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes charged so far."""
        return self._used

    def check_declared(self, declared: int, source: str) -> None:
        """Fail when `source` declares more bytes than the limit admits (with those charged)."""
        if self.limit is not None and self._used + declared > self.limit:
            raise FetchFailed(
                Reason.MODEL_TOO_LARGE,
                f"{source} declares {declared} bytes; {self.what} may take at most "
                f"{self.limit} bytes (--max-bytes)",
            )

    def charge(self, size: int) -> None:
        """Count `size` more bytes; fail once the total passes the limit."""
        with self._lock:
            self._used += size
            used = self._used
        if self.limit is not None and used > self.limit:
            raise FetchFailed(
                Reason.MODEL_TOO_LARGE,
                f"{self.what} passed {self.limit} bytes (--max-bytes) while fetching",
            )


def metered(
    chunks: Iterable[bytes], budget: ByteBudget, progress: Progress | None = None
) -> Iterator[bytes]:
    """`chunks`, each charged to `budget` (and counted by `progress`) before it is passed on."""
    for chunk in chunks:
        budget.charge(len(chunk))
        if progress is not None:
            progress.advance(len(chunk))
        yield chunk
