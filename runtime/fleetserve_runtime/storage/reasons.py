"""Why a fetch failed: one named reason each, the only failure the fetchers raise.

The reason is what an init container's termination message carries (`{"reason": ...,
"message": ...}`), so the operator can show it in the pod's and the service's status. Every
fetcher maps its client's errors to one of these; `for_status` is the shared table for HTTP
statuses. Messages pass through `redact.clean` (no credentials, bounded length).
"""

from __future__ import annotations

from enum import StrEnum

from fleetserve_runtime.storage.redact import clean

__all__ = ["FetchFailed", "Reason", "for_status"]


class Reason(StrEnum):
    """The reasons a fetch fails, spelled as they appear in the termination message.

    The operator reads these names back (its `contract.FetchFailure`; a contract test keeps
    the two in step).
    """

    ACCESS_DENIED = "AccessDenied"
    """The store refused the credentials (or their absence), or they could not be read."""
    DIGEST_MISMATCH = "DigestMismatch"
    """The bytes fetched are not the ones the URI or `--digest` pins."""
    INTERNAL_ERROR = "InternalError"
    """A failure no other reason explains: a bug; the message names the exception type."""
    INVALID_ARCHIVE = "InvalidArchive"
    """An archive or a store's listing cannot be laid out safely (a link, a path outside the
    model, a device, a truncated or corrupt archive, too many files)."""
    INVALID_URI = "InvalidUri"
    """The URI (or `--digest`) is not one this initializer accepts."""
    MODEL_NOT_FOUND = "ModelNotFound"
    """The bucket, prefix, object, repository, manifest, revision or file does not exist."""
    MODEL_TOO_LARGE = "ModelTooLarge"
    """The model is larger than `--max-bytes`, or the volume ran out of space."""
    STORAGE_UNREACHABLE = "StorageUnreachable"
    """The store could not be reached, stalled, or answered with a server error."""


class FetchFailed(Exception):
    """A fetch failed for `reason`; `message` says what, for the pod's status."""

    def __init__(self, reason: Reason, message: str) -> None:
        self.reason = reason
        self.message = clean(message)
        super().__init__(f"{reason}: {self.message}")


def for_status(status: int, what: str) -> FetchFailed:
    """The failure an HTTP error status means when fetching `what`."""
    if status in (401, 403):
        return FetchFailed(Reason.ACCESS_DENIED, f"{what}: the store answered {status}")
    if status in (404, 410):
        return FetchFailed(Reason.MODEL_NOT_FOUND, f"{what}: the store answered {status}")
    return FetchFailed(Reason.STORAGE_UNREACHABLE, f"{what}: the store answered {status}")
