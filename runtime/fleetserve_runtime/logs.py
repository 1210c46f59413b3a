"""Structured logging that never writes on the serving threads.

Records are put on an in-memory queue by a `QueueHandler` (cheap, non-blocking) and formatted
and written by a `QueueListener` thread, so a slow stderr never stalls the event loop or the
executor. JSON lines by default; plain text for a terminal.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import queue
import sys
from typing import Any

__all__ = ["JsonFormatter", "configure_logging"]

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and any `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Render `record` as a JSON line."""
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str, fmt: str) -> logging.handlers.QueueListener:
    """Route all logging through a queue to stderr; returns the started listener to stop at exit."""
    sink = logging.StreamHandler(sys.stderr)
    sink.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(level.upper())
    listener = logging.handlers.QueueListener(records, sink, respect_handler_level=False)
    listener.start()
    return listener
