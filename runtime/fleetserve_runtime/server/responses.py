"""Error answers of the HTTP edge: the runtime's shape, or OpenAI's on OpenAI's paths.

Every domain error becomes a JSON body `{"error": ..., "request_id": ...}` through
`http_errors.STATUS_OF`, the one error → status table; on the paths `generation.speaks_openai`
names, OpenAI's `{"error": {"message", "type", "param", "code"}, "request_id"}` instead.
`register_error_handlers` answers so what escapes a route: FastAPI's own HTTP and validation
errors, and domain errors.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleetserve_runtime.core.errors import FleetserveError
from fleetserve_runtime.server.generation import speaks_openai
from fleetserve_runtime.server.generation_formats import openai_failure
from fleetserve_runtime.server.http_errors import (
    error_body,
    failure_of,
    json_response,
    log_unexpected,
    request_id,
)
from fleetserve_runtime.server.openai_responses import openai_error

__all__ = ["error_response", "failure_response", "register_error_handlers", "unexpected_response"]


def error_response(
    status: int,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    path: str = "",
    **extra: Any,
) -> Response:
    """An error answer; on OpenAI's paths in OpenAI's shape (`extra` is then dropped)."""
    if speaks_openai(path):
        body = openai_error(status, message, request_id=request_id(), param=None, code=None)
        return json_response(body, status, headers)
    return json_response(error_body(message, **extra), status, headers)


def failure_response(exc: FleetserveError, path: str = "") -> Response:
    """A domain error's answer; on OpenAI's paths in OpenAI's shape."""
    return (openai_failure(exc) if speaks_openai(path) else failure_of(exc)).response()


def unexpected_response() -> Response:
    """A 500 for a bug: an id to find the traceback in the log, never the traceback itself."""
    return error_response(500, f"internal error (error id {log_unexpected()})")


def register_error_handlers(app: FastAPI) -> None:
    """Answer FastAPI's HTTP and validation errors, and domain errors, in the shapes above."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        return error_response(
            exc.status_code, str(exc.detail), headers=headers, path=request.url.path
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"]) or "request"
        return error_response(400, f"{where}: {first['msg']}", path=request.url.path)

    @app.exception_handler(FleetserveError)
    async def domain_error(request: Request, exc: FleetserveError) -> Response:
        return failure_response(exc, request.url.path)
