"""Domain errors of the runtime; `api` maps each to its HTTP status in one table.

Every error carries a message meant for the caller: it says what was wrong and, where there
is one, the limit that was crossed.
"""

from __future__ import annotations

__all__ = [
    "BatchFailed",
    "DeadlineExceeded",
    "Forbidden",
    "InputTooLong",
    "InvalidInput",
    "ItemFailed",
    "ModelNotFound",
    "ModelNotReady",
    "OutOfMemory",
    "PayloadTooLarge",
    "QueueFull",
    "RequestTimeout",
    "TenantOverQuota",
    "FleetserveError",
    "TooManyStreams",
    "Unauthorized",
    "UnsupportedMediaType",
]


class FleetserveError(Exception):
    """Base of every error the runtime reports to a caller."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(FleetserveError):
    """The request body or an instance in it is malformed; `param` names the field if known."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Unauthorized(FleetserveError):
    """The request carries no valid bearer token; `challenge` is its `WWW-Authenticate`."""

    def __init__(self, message: str, *, challenge: str) -> None:
        super().__init__(message)
        self.challenge = challenge


class Forbidden(FleetserveError):
    """The caller is authenticated but may not do this (e.g. load a URI not on the allowlist)."""


class UnsupportedMediaType(FleetserveError):
    """The body is not in a format this endpoint accepts (JSON only)."""


class RequestTimeout(FleetserveError):
    """The client did not send its request within the configured time."""


class InputTooLong(FleetserveError):
    """An instance is longer than the model's `max_sequence_length` and truncation was not asked."""


class PayloadTooLarge(FleetserveError):
    """The request carries more bytes or instances than the server accepts."""


class ModelNotFound(FleetserveError):
    """No model (or model version) of that name is loaded."""


class ModelNotReady(FleetserveError):
    """The model exists but has not finished loading and warming up."""


class QueueFull(FleetserveError):
    """The request queue is at its bound; the caller should retry after `retry_after_s`."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(FleetserveError):
    """The request's deadline passed before it could be computed."""


class BatchFailed(FleetserveError):
    """The batch this request was in raised; `error_id` finds the traceback in the log."""

    def __init__(self, message: str, *, error_id: str) -> None:
        super().__init__(message)
        self.error_id = error_id


class ItemFailed(FleetserveError):
    """The model reported a failure for this one instance."""


class OutOfMemory(FleetserveError):
    """A batch did not fit the memory budget even when split down to one request."""


class TooManyStreams(QueueFull):
    """The server streams `generation.max_streams` generations already (503, Retry-After)."""


class TenantOverQuota(QueueFull):
    """A tenant has its quota of requests in flight (429, Retry-After); others are served."""

    def __init__(self, message: str, *, retry_after_s: float, tenant: str) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.tenant = tenant
