"""Wait for a condition with a deadline: the harness's only way to wait (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class GiveUpError(Exception):
    """Raised by a condition to end the wait at once (e.g. the awaited process exited)."""


def wait_until(
    condition: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
) -> T:
    """Poll ``condition`` until it returns a value other than None or False, and return it.

    Exceptions raised by ``condition`` count as "not yet" (a server that is still starting
    refuses connections); the last one is chained to the timeout for diagnosis.

    Raises:
        GiveUpError: The condition decided that waiting longer is pointless.
        TimeoutError: ``timeout_s`` seconds passed; the message names ``what`` was awaited.
    """
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            result = condition()
        except GiveUpError:
            raise
        except Exception as error:  # any failure means "not ready yet"
            last_error = error
        else:
            if result is not None and result is not False:
                return result
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout_s:.0f}s waiting for {what}"
            raise TimeoutError(message) from last_error
        time.sleep(interval_s)
