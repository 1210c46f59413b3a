"""Domain errors as HTTP answers: the one error → status table, and the JSON responses.

`responses` (the runtime's own JSON error shape) and `generation` (OpenAI's error shape, the
OIP generate extension) both answer through here, so a domain error has one status
wherever it surfaces; the only difference is `GENERATION_STATUS_OF`, where a prompt over the
model's context is a 400, as LLM clients expect, not an encoder's 413.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response

from fleetserve_runtime.core.errors import (
    BatchFailed,
    DeadlineExceeded,
    FleetserveError,
    Forbidden,
    InputTooLong,
    InvalidInput,
    ItemFailed,
    ModelNotFound,
    ModelNotReady,
    OutOfMemory,
    PayloadTooLarge,
    QueueFull,
    RequestTimeout,
    TenantOverQuota,
    Unauthorized,
    UnsupportedMediaType,
)
from fleetserve_runtime.core.logs import current_request

__all__ = [
    "GENERATION_STATUS_OF",
    "STATUS_OF",
    "Failure",
    "error_body",
    "error_headers",
    "failure_of",
    "json_response",
    "log_unexpected",
    "request_id",
    "status_of",
]

log = logging.getLogger("fleetserve.api")

STATUS_OF: dict[type[FleetserveError], int] = {
    InvalidInput: 400,
    Unauthorized: 401,
    Forbidden: 403,
    ModelNotFound: 404,
    RequestTimeout: 408,
    PayloadTooLarge: 413,
    InputTooLong: 413,
    UnsupportedMediaType: 415,
    ItemFailed: 500,
    BatchFailed: 500,
    TenantOverQuota: 429,
    QueueFull: 503,
    ModelNotReady: 503,
    OutOfMemory: 503,
    DeadlineExceeded: 504,
}
"""Error type → HTTP status; the single place where domain errors meet HTTP."""

GENERATION_STATUS_OF: dict[type[FleetserveError], int] = {**STATUS_OF, InputTooLong: 400}
"""The generation routes' table: OpenAI's clients (and the official one's retry logic) take a
prompt over the context for a 400; a 413 reads as "body too large"."""


def status_of(exc: FleetserveError, table: Mapping[type[FleetserveError], int] = STATUS_OF) -> int:
    """The status `table` gives `exc` (the first entry it is an instance of)."""
    return next(code for kind, code in table.items() if isinstance(exc, kind))


def error_headers(exc: FleetserveError) -> dict[str, str]:
    """Headers an error answer carries: `Retry-After`, the auth challenge, `Connection: close`."""
    headers: dict[str, str] = {}
    if isinstance(exc, QueueFull):
        headers["retry-after"] = str(max(1, round(exc.retry_after_s)))
    if isinstance(exc, Unauthorized):
        headers["www-authenticate"] = exc.challenge
    if isinstance(exc, RequestTimeout | PayloadTooLarge | UnsupportedMediaType | Unauthorized):
        # Answered before (or instead of) reading the body: the rest of it, which may
        # trickle in for good, must not keep the connection open.
        headers["connection"] = "close"
    return headers


@dataclass(frozen=True, slots=True)
class Failure:
    """An error as one API answers it: status, JSON body, headers."""

    status: int
    body: object
    headers: Mapping[str, str] = field(default_factory=dict)

    def response(self) -> Response:
        """The JSON response."""
        return json_response(self.body, self.status, self.headers)


def error_body(message: str, **extra: Any) -> dict[str, Any]:
    """The runtime's error shape: `{"error": message, "request_id": ..., **extra}`."""
    return {"error": message, "request_id": request_id(), **extra}


def failure_of(
    exc: FleetserveError, table: Mapping[type[FleetserveError], int] = STATUS_OF
) -> Failure:
    """`exc` in the runtime's error shape, with its status in `table` and its headers."""
    extra = {"error_id": exc.error_id} if isinstance(exc, BatchFailed) else {}
    return Failure(status_of(exc, table), error_body(exc.message, **extra), error_headers(exc))


def request_id() -> str:
    """The id of the request being answered (a fresh one outside a request)."""
    context = current_request()
    return context.request_id if context is not None else uuid.uuid4().hex


def json_response(
    content: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """`content` as an `application/json` response (numpy arrays serialised as lists)."""
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def log_unexpected(exc: BaseException | None = None) -> str:
    """Log `exc` (default: the exception being handled), a bug, under a new error id.

    Returns the id; the caller answers 500 naming it, never the traceback.
    """
    error_id = uuid.uuid4().hex[:12]
    log.error("unexpected error", exc_info=exc or True, extra={"error_id": error_id})
    return error_id
