"""Failure reasons: their names, the HTTP status table, and messages fit for a pod's status."""

from __future__ import annotations

import pytest

from fleetserve_runtime.storage.reasons import FetchFailed, Reason, for_status
from fleetserve_runtime.storage.redact import MAX_MESSAGE_CHARS, remember_secret


def test_reason_names_are_the_termination_message_words() -> None:
    """The reasons are spelled as the operator reads them from the termination message."""
    assert {r.value for r in Reason} == {
        "ModelNotFound",
        "AccessDenied",
        "DigestMismatch",
        "ModelTooLarge",
        "StorageUnreachable",
        "InvalidArchive",
        "InvalidUri",
        "InternalError",
    }


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (401, Reason.ACCESS_DENIED),
        (403, Reason.ACCESS_DENIED),
        (404, Reason.MODEL_NOT_FOUND),
        (410, Reason.MODEL_NOT_FOUND),
        (429, Reason.STORAGE_UNREACHABLE),
        (500, Reason.STORAGE_UNREACHABLE),
        (503, Reason.STORAGE_UNREACHABLE),
        (400, Reason.STORAGE_UNREACHABLE),
    ],
)
def test_status_table(status: int, reason: Reason) -> None:
    """An HTTP error status maps to one reason, and the message gives the status."""
    failure = for_status(status, "s3://b/k")
    assert failure.reason is reason
    assert str(status) in failure.message


def test_message_is_bounded() -> None:
    """A message never passes the bound, however long what it quotes."""
    failure = FetchFailed(Reason.MODEL_NOT_FOUND, "x" * 10_000)
    assert len(failure.message) == MAX_MESSAGE_CHARS


def test_message_never_carries_a_secret() -> None:
    """A remembered secret, a URL's user-info and a URL's query are blanked."""
    remember_secret("hunter2-secret-value")
    failure = FetchFailed(
        Reason.ACCESS_DENIED,
        "token hunter2-secret-value refused at https://user:pw@host/x?X-Amz-Signature=abc#frag",
    )
    assert "hunter2" not in failure.message
    assert "user:pw" not in failure.message
    assert "X-Amz-Signature" not in failure.message
    assert "https://***@host/x?***#frag" in failure.message
