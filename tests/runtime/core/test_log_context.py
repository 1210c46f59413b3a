"""Every log record about a request can be traced to it: ids are strict, and never dropped.

The text format prints every field the JSON format does; ids that W3C or our own rules call
invalid are replaced, never logged; and the executor's batch records name their requests.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from fleetserve_runtime.core.errors import BatchFailed
from fleetserve_runtime.core.logs import (
    JsonFormatter,
    RequestContext,
    TextFormatter,
    bind_request,
    request_id_from,
    traceparent_from,
    unbind_request,
)
from fleetserve_runtime.serving.runtime import InferenceCall, Runtime
from fleetserve_runtime.testing import make_config

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.mark.parametrize("header", ["req-1\n", "req-1\r\n", "\nreq-1"])
def test_a_request_id_with_a_line_break_is_replaced(header: str) -> None:
    """The whole header must be printable ASCII: a trailing newline is not."""
    assert re.fullmatch(r"[0-9a-f]{32}", request_id_from(header))


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(f"ff-{TRACE_ID}-{PARENT_ID}-01", id="version-ff"),
        pytest.param(f"00-{'0' * 32}-{PARENT_ID}-01", id="zero-trace-id"),
        pytest.param(f"00-{TRACE_ID}-{'0' * 16}-01", id="zero-parent-id"),
        pytest.param(f"00-{TRACE_ID}-{PARENT_ID}-01-extra", id="extra-field"),
    ],
)
def test_invalid_traceparents_are_not_logged(header: str) -> None:
    """W3C calls version ff and all-zero ids invalid; they never reach a log record."""
    assert traceparent_from(header) is None


def test_a_valid_traceparent_is_kept() -> None:
    """A version-00 header with non-zero ids passes, lower-cased."""
    header = f"00-{TRACE_ID.upper()}-{PARENT_ID}-01"
    assert traceparent_from(header) == header.lower()


def test_text_lines_carry_every_extra_field_escaped() -> None:
    """Error ids, statuses and reasons are in text lines too; odd values stay on one line."""
    record = logging.LogRecord("fleetserve.x", logging.WARNING, __file__, 1, "refused", (), None)
    record.request_id = "req-3"
    record.error_id = "abc123def456"
    record.status = 400
    record.why = 'bad "header"\nINJECTED 2020-01-01 INFO fake'
    record.request_ids = ["a", "b"]
    text = TextFormatter().format(record)
    assert "\n" not in text
    assert " request_id=req-3 error_id=abc123def456 status=400 " in text
    assert ' why="bad \\"header\\"\\nINJECTED 2020-01-01 INFO fake"' in text
    assert text.endswith(' request_ids="[\\"a\\", \\"b\\"]"')
    fields = set(json.loads(JsonFormatter().format(record))) - {"ts", "level", "logger", "msg"}
    assert fields == {"request_id", "error_id", "status", "why", "request_ids"}


async def test_batch_records_name_the_requests_in_the_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed batch's error id leads to its requests; sampled batch records list them too."""
    config = make_config(
        model="fleetserve_runtime.testing:exploding_handler",
        log_batch_sample=1,
        batching={"max_queue_delay_ms": 50},
    )
    runtime = Runtime(config)
    await runtime.start()
    try:
        await runtime.wait_ready()

        async def infer(request_id: str, text: str) -> BaseException | None:
            token = bind_request(RequestContext(request_id))
            try:
                await runtime.infer(InferenceCall([text]))
            except BatchFailed as exc:
                return exc
            finally:
                unbind_request(token)
            return None

        with caplog.at_level(logging.INFO, logger="fleetserve.executor"):
            await infer("req-ok", "fine")
            failures = [await infer("req-boom", "boom")]
    finally:
        await runtime.stop()
    records = [r for r in caplog.records if r.name == "fleetserve.executor"]
    failed = next(r for r in records if r.getMessage() == "batch failed")
    error = failures[0]
    assert isinstance(error, BatchFailed)
    assert (failed.__dict__["error_id"], failed.__dict__["request_ids"]) == (
        error.error_id,
        ["req-boom"],
    )
    batches = [r.__dict__["request_ids"] for r in records if r.getMessage() == "batch"]
    assert ["req-ok"] in batches
