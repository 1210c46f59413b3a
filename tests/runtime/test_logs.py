"""Log records carry the request's trace ids, from any thread the request uses; ms timestamps."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterator

import pytest

from fleetserve_runtime.logs import (
    JsonFormatter,
    RequestContext,
    RequestContextFilter,
    TextFormatter,
    bind_request,
    request_id_from,
    traceparent_from,
    unbind_request,
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
