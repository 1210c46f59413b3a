"""Reading a request's body: its media type checked, its size and arrival time bounded.

Bodies must be `application/json` (or, on the v2 infer routes, in the binary tensor data
extension: `binary_tensors`), and are read with a byte limit (`max_body_bytes`) and a
deadline (`http.body_timeout_s`), so a slow or endless body cannot hold a request open.
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from starlette.requests import ClientDisconnect

from fleetserve_runtime.core.errors import (
    InvalidInput,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
)

__all__ = ["BINARY_TENSOR_HEADER", "json_media_refusal", "read_body", "require_json"]

BINARY_TENSOR_HEADER = "inference-header-content-length"
"""Marks a request (or response) in the OIP binary tensor data extension (`binary_tensors`)."""


def json_media_refusal(
    content_type: str | None, *, binary_extension: bool, missing_is_json: bool = False
) -> str | None:
    """Why a body with this `Content-Type` is not accepted as JSON, or None when it is.

    Only `application/json` (UTF-8) is: HTML forms cannot send it without a CORS preflight,
    so a cross-site form post never reaches a model. With `missing_is_json` (the inference
    routes), a body without any `Content-Type` is JSON too: NVIDIA's `tritonclient.http` in
    JSON mode sends none, and Triton takes it. The media types a browser may send cross-site
    without a preflight (`text/plain`, forms) stay refused.
    """
    if binary_extension:
        return (
            "the binary tensor data extension (Inference-Header-Content-Length) is accepted "
            "on the v2 infer routes only; send JSON with Content-Type: application/json"
        )
    if content_type is None and missing_is_json:
        return None
    media, _, parameters = (content_type or "").partition(";")
    if media.strip().lower() != "application/json":
        shown = media.strip()[:80] or "none"
        return f"Content-Type must be application/json, got {shown!r}"
    for parameter in parameters.split(";"):
        key, _, value = parameter.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() != "utf-8":
            return "JSON bodies must be UTF-8 (charset=utf-8)"
    return None


def require_json(request: Request, *, missing_is_json: bool) -> None:
    """`UnsupportedMediaType` unless the request's body is JSON (`json_media_refusal`)."""
    refusal = json_media_refusal(
        request.headers.get("content-type"),
        binary_extension=BINARY_TENSOR_HEADER in request.headers,
        missing_is_json=missing_is_json,
    )
    if refusal is not None:
        raise UnsupportedMediaType(refusal)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body: `PayloadTooLarge` past `limit` bytes, `RequestTimeout` after `timeout_s`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        msg = f"request body of {declared} bytes exceeds the limit of {limit} bytes"
        raise PayloadTooLarge(msg)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    msg = f"request body exceeds the limit of {limit} bytes"
                    raise PayloadTooLarge(msg)
                chunks.append(chunk)
    except TimeoutError:
        msg = f"request body not received within {timeout_s:g} s (body_timeout_s)"
        raise RequestTimeout(msg) from None
    except ClientDisconnect:
        msg = "the client disconnected before sending the whole body"
        raise InvalidInput(msg) from None
    return b"".join(chunks)
