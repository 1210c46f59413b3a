"""The byte budget: declared sizes checked first, bytes charged as they stream; progress."""

from __future__ import annotations

import pytest

from fleetserve_runtime.storage.budget import ByteBudget, metered
from fleetserve_runtime.storage.progress import Progress
from fleetserve_runtime.storage.reasons import FetchFailed, Reason


def test_declared_size_over_the_limit_fails_before_any_byte() -> None:
    """A declared size past the limit is ModelTooLarge, naming the source and the limit."""
    budget = ByteBudget(100, "the model")
    budget.check_declared(100, "s3://b/p (its listing)")
    with pytest.raises(FetchFailed) as failed:
        budget.check_declared(101, "s3://b/p (its listing)")
    assert failed.value.reason is Reason.MODEL_TOO_LARGE
    assert "101" in failed.value.message
    assert "100" in failed.value.message
    assert "s3://b/p" in failed.value.message


def test_declared_size_counts_what_was_charged() -> None:
    """The next archive member is checked against what is left, not the whole limit."""
    budget = ByteBudget(100, "the model")
    budget.charge(60)
    budget.check_declared(40, "member a")
    with pytest.raises(FetchFailed):
        budget.check_declared(41, "member b")


def test_streamed_bytes_stop_at_the_limit() -> None:
    """A stream that sends more than declared stops with ModelTooLarge at the limit."""
    budget = ByteBudget(10, "the download")
    passed: list[bytes] = []
    with pytest.raises(FetchFailed) as failed:
        passed.extend(metered(iter([b"1234", b"5678", b"9abc", b"def0"]), budget))
    assert failed.value.reason is Reason.MODEL_TOO_LARGE
    assert passed == [b"1234", b"5678"]


def test_no_limit() -> None:
    """Without --max-bytes, nothing is refused."""
    budget = ByteBudget(None, "the model")
    budget.check_declared(1 << 50, "huge")
    budget.charge(1 << 50)
    assert budget.used == 1 << 50


def test_progress_events_step_through_the_total() -> None:
    """Events go out at the start, at each hundredth (at least 1 MiB) and at the end."""
    events: list[dict[str, object]] = []
    progress = Progress(events.append)
    total = 200 << 20
    progress.start(total)
    for _ in range(200):
        progress.advance(1 << 20)
    progress.finish()
    assert events[0] == {"event": "progress", "bytes_done": 0, "bytes_total": total}
    assert events[-1] == {"event": "progress", "bytes_done": total, "bytes_total": total}
    assert 90 <= len(events) <= 110
    done = [e["bytes_done"] for e in events if isinstance(e["bytes_done"], int)]
    assert len(done) == len(events)
    assert done == sorted(done)


def test_progress_without_a_total() -> None:
    """Without a declared total, events come every 16 MiB with a null total."""
    events: list[dict[str, object]] = []
    progress = Progress(events.append)
    progress.start(None)
    progress.advance(15 << 20)
    assert len(events) == 1
    progress.advance(1 << 20)
    assert events[-1] == {"event": "progress", "bytes_done": 16 << 20, "bytes_total": None}
