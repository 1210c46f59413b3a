"""Log records carry the request's trace ids, from any thread the request uses; ms timestamps."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import logging.handlers
import re
import sys
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from fleetserve_runtime.core.logs import (
    LOG_QUEUE_SIZE,
    JsonFormatter,
    RequestContext,
    RequestContextFilter,
    TextFormatter,
    bind_request,
    configure_logging,
    dropped_records,
    request_id_from,
    traceparent_from,
    unbind_request,
)
from fleetserve_runtime.core.metrics import RuntimeMetrics, StateSnapshot

SNAPSHOT = StateSnapshot(
    queue_depth=0,
    inflight_requests=0,
    memory_allocated_bytes=0,
    memory_reserved_bytes=0,
    pool_hits=0,
    pool_misses=0,
    models={},
)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RequestContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def collected() -> Iterator[list[logging.LogRecord]]:
    logger = logging.getLogger("fleetserve.test-logs")
    handler = _Collect()
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


async def test_records_of_a_request_carry_its_ids(collected: list[logging.LogRecord]) -> None:
    """Records on the request's task and in threads it starts carry its ids; others none."""
    logger = logging.getLogger("fleetserve.test-logs")
    token = bind_request(RequestContext("req-1", TRACEPARENT))
    try:
        logger.warning("on the loop")
        await asyncio.to_thread(logger.warning, "in a thread")
    finally:
        unbind_request(token)
    logger.warning("after the request")
    assert [getattr(r, "request_id", None) for r in collected] == ["req-1", "req-1", None]
    assert getattr(collected[1], "traceparent", None) == TRACEPARENT


def test_json_and_text_lines_have_milliseconds_and_ids() -> None:
    """Both formats print UTC times with milliseconds and the request's ids."""
    record = logging.LogRecord("fleetserve.x", logging.INFO, __file__, 1, "hello", (), None)
    record.created = 1_700_000_000.123
    record.request_id = "req-2"
    record.traceparent = TRACEPARENT
    entry = json.loads(JsonFormatter().format(record))
    assert entry["ts"] == "2023-11-14T22:13:20.123+00:00"
    assert (entry["request_id"], entry["traceparent"]) == ("req-2", TRACEPARENT)
    text = TextFormatter().format(record)
    assert re.match(r"2023-11-14T22:13:20\.123\+00:00 INFO fleetserve\.x hello", text)
    assert f"request_id=req-2 traceparent={TRACEPARENT}" in text


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        pytest.param("abc-123_x.y", True, id="token"),
        pytest.param("a" * 129, False, id="too-long"),
        pytest.param("line\nbreak", False, id="control"),
        pytest.param("", False, id="empty"),
        pytest.param(None, False, id="absent"),
    ],
)
def test_request_id_from(header: str | None, kept: bool) -> None:
    """A sane caller id is kept; anything else becomes a fresh 32-hex id."""
    request_id = request_id_from(header)
    if kept:
        assert request_id == header
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", request_id)


def test_traceparent_from() -> None:
    """Only well-formed W3C traceparent values are logged."""
    assert traceparent_from(TRACEPARENT.upper()) == TRACEPARENT
    assert traceparent_from("00-xyz") is None
    assert traceparent_from(None) is None


class _StalledStream(io.StringIO):
    """A stderr whose writes wait until released (a full pipe, a stopped log collector)."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def write(self, text: str) -> int:
        self.released.wait(timeout=30)
        return super().write(text)


def test_a_stalled_stderr_bounds_the_queue_and_counts_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Records past `LOG_QUEUE_SIZE` are dropped at once and counted in the metrics."""
    stream = _StalledStream()
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    kept_handlers, kept_level = root.handlers[:], root.level
    listener = configure_logging("info", "json")
    try:
        (handler,) = root.handlers
        assert isinstance(handler, logging.handlers.QueueHandler)
        before = dropped_records()
        extra = 500
        for i in range(LOG_QUEUE_SIZE + extra):
            logging.getLogger("fleetserve.test-logs").info("record %d", i)
        assert handler.queue.qsize() <= LOG_QUEUE_SIZE
        # The writer holds one record while it waits; every other one past the bound is lost.
        assert dropped_records() - before >= extra - 1
        metrics = RuntimeMetrics(model="m", track="stable", snapshot=lambda: SNAPSHOT)
        text = generate_latest(metrics.registry).decode()
        assert f"fleetserve_log_records_dropped_total {float(dropped_records())}" in text
    finally:
        stream.released.set()
        listener.stop()
        root.handlers[:] = kept_handlers
        root.setLevel(kept_level)
    assert '"msg": "record 0"' in stream.getvalue()
