"""Structured logging that never writes on the serving threads, with each request's trace ids.

Records are put on an in-memory queue by a `QueueHandler` (cheap, non-blocking) and formatted
and written by a `QueueListener` thread, so a slow stderr never stalls the event loop or the
executor. The queue holds at most `LOG_QUEUE_SIZE` records: when stderr stalls (a full pipe,
a stopped log collector) records beyond it are dropped, never waited for, so logging neither
blocks a serving thread nor grows memory without bound; `dropped_records` counts them (the
`fleetserve_log_records_dropped_total` metric). JSON lines by default; plain text for a
terminal. Timestamps are UTC with milliseconds.

`api` binds a `RequestContext` (the request's `X-Request-ID` and W3C `traceparent`) for the
duration of each request; a filter on the queue handler copies it onto every record emitted
while it is bound, on whatever thread the record was made (copied contexts included), so
log lines and traces can be joined.
"""

from __future__ import annotations

import contextvars
import json
import logging
import logging.handlers
import os
import queue
import random
import re
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "LOG_QUEUE_SIZE",
    "DroppingQueueHandler",
    "JsonFormatter",
    "RequestContext",
    "RequestContextFilter",
    "TextFormatter",
    "bind_request",
    "configure_logging",
    "current_request",
    "dropped_records",
    "new_request_id",
    "request_id_from",
    "traceparent_from",
    "unbind_request",
]

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's copy of the message with terminal colour codes
}

_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
"""Printable ASCII without spaces, bounded: anything else is replaced by a generated id, so
a caller cannot smuggle line breaks or megabytes into every log line of its request."""

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")

_PLAIN_VALUE = re.compile(r"[\x21-\x7e]+")
"""Text-format values printed as they are; anything else (spaces, quotes, line breaks,
non-ASCII) is printed as a JSON string, so one record stays one parseable line."""


@dataclass(frozen=True, slots=True)
class RequestContext:
    """The ids that tie a request's log records to the caller's request and trace."""

    request_id: str
    traceparent: str | None = None


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "fleetserve_request", default=None
)


_ids = random.Random()
"""Draws request ids: they must be unique, not secret, and `uuid4` costs a system call per
request (os.urandom), a measurable share of a request's cost at thousands per second."""
os.register_at_fork(after_in_child=_ids.seed)


def new_request_id() -> str:
    """A fresh request id: 128 random bits as 32 hex digits, like `uuid4().hex`."""
    return f"{_ids.getrandbits(128):032x}"


def request_id_from(header: str | None) -> str:
    """The caller's `X-Request-ID` when it is a sane token, else a fresh one."""
    if header is not None and _REQUEST_ID.fullmatch(header):
        return header
    return new_request_id()


def traceparent_from(header: str | None) -> str | None:
    """The W3C `traceparent` header when valid (version-traceid-parentid-flags), else None.

    W3C defines version `ff` and all-zero trace or parent ids as invalid.
    """
    if header is None:
        return None
    value = header.strip().lower()
    parts = _TRACEPARENT.fullmatch(value)
    if parts is None:
        return None
    version, trace_id, parent_id = parts.groups()
    if version == "ff" or not int(trace_id, 16) or not int(parent_id, 16):
        return None
    return value


def bind_request(context: RequestContext) -> contextvars.Token[RequestContext | None]:
    """Make `context` current until `unbind_request(token)`."""
    return _current.set(context)


def unbind_request(token: contextvars.Token[RequestContext | None]) -> None:
    """Restore the context that was current before `bind_request`."""
    _current.reset(token)


def current_request() -> RequestContext | None:
    """The request being served by this task or thread, if any."""
    return _current.get()


class RequestContextFilter(logging.Filter):
    """Adds `request_id` (and `traceparent`) to records made while a request is bound."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Annotate `record`; never drops it."""
        context = _current.get()
        if context is not None:
            record.request_id = context.request_id
            if context.traceparent is not None:
                record.traceparent = context.traceparent
        return True


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and any `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Render `record` as a JSON line."""
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _text_value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if _PLAIN_VALUE.fullmatch(text) and '"' not in text:
        return text
    return json.dumps(text)


class TextFormatter(logging.Formatter):
    """`time level logger message`, then every `extra` field as `key=value`.

    The fields are the same as in the JSON format (request ids, error ids, statuses, ...);
    values with spaces, quotes or control characters are printed as JSON strings.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Render `record` as one line of text (plus a traceback, if any)."""
        line = f"{_timestamp(record)} {record.levelname} {record.name} {record.getMessage()}"
        for key, value in record.__dict__.items():
            if key not in _STANDARD:
                line += f" {key}={_text_value(value)}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


LOG_QUEUE_SIZE = 10_000
"""Most records waiting for the writer thread; a few seconds of a busy server's logs."""

_dropped = 0
_dropped_lock = threading.Lock()


def dropped_records() -> int:
    """Records dropped so far in this process because the log queue was full."""
    return _dropped


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """A `QueueHandler` on a bounded queue that drops a record when the queue is full.

    The standard handler's `put_nowait` raises on a full queue, and its error handling then
    prints a traceback to the very stderr that is stalled; a blocking `put` would stall the
    event loop instead.
    """

    def enqueue(self, record: logging.LogRecord) -> None:
        """Queue `record`, or count it dropped."""
        global _dropped  # one process-wide count, read by the metrics
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            with _dropped_lock:
                _dropped += 1


class _Listener(logging.handlers.QueueListener):
    """A `QueueListener` whose stop waits for room for its sentinel in the bounded queue."""

    def enqueue_sentinel(self) -> None:
        """Queue the stop sentinel; the standard `put_nowait` fails on a full queue."""
        self.queue.put(self._sentinel)  # type: ignore[attr-defined]  # untyped upstream


def configure_logging(level: str, fmt: str) -> logging.handlers.QueueListener:
    """Route all logging through a queue to stderr; returns the started listener to stop at exit."""
    sink = logging.StreamHandler(sys.stderr)
    sink.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    records: queue.Queue[logging.LogRecord] = queue.Queue(LOG_QUEUE_SIZE)
    handler = DroppingQueueHandler(records)
    # A filter on the handler runs on the thread that logs, where the request is still bound;
    # the listener thread that formats the record later could not see it.
    handler.addFilter(RequestContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    listener = _Listener(records, sink, respect_handler_level=False)
    listener.start()
    return listener
