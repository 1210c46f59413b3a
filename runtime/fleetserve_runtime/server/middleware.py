"""The HTTP apps' ASGI middlewares: request context, bearer tokens, the infer fast path.

Outermost first, as `app` stacks them: every request gets a request id (its `X-Request-ID`,
or a new one) bound to its log records and returned in its response; then, where a token
file is set, a bearer token is required; then, where a tenants table is set, the request's
tenant is identified and held to its quota; innermost, `POST` to a v2 infer path skips
FastAPI's router. Headers are looked up in a dict (`_IndexedHeaders`): these run on every request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

from fastapi import Request, Response
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetserve_runtime.core.auth import TokenFile, bearer_token, token_matches
from fleetserve_runtime.core.errors import InvalidInput, TenantOverQuota, Unauthorized
from fleetserve_runtime.core.logs import (
    RequestContext,
    bind_request,
    request_id_from,
    traceparent_from,
    unbind_request,
)
from fleetserve_runtime.core.tenants import TENANT_HEADER
from fleetserve_runtime.server.responses import failure_response, unexpected_response
from fleetserve_runtime.serving.admission import Tenancy, served_as_tenant

__all__ = [
    "BearerAuthMiddleware",
    "InferFastPath",
    "InferRoute",
    "RequestContextMiddleware",
    "TenantMiddleware",
]

log = logging.getLogger("fleetserve.api")

InferRoute = Callable[[Request, str, str | None], Awaitable[Response]]
"""A v2 infer route body: (request, model name, version or None) → its answer."""


class _IndexedHeaders(Headers):
    """Starlette's request headers, looked up in a dict.

    Starlette scans the header list on every look-up, and raises and catches a `KeyError`
    for each absent one; the infer routes ask for about eight headers, most of them absent.
    As in Starlette, the first of repeated headers is the one found.
    """

    def __init__(self, scope: Scope) -> None:
        super().__init__(scope=scope)
        index: dict[bytes, bytes] = {}
        for key, value in self.raw:
            index.setdefault(key, value)
        self._index = index

    def get(self, key: str, default: Any = None) -> Any:
        """The header's value, or `default` when absent."""
        value = self._index.get(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def __getitem__(self, key: str) -> str:
        value = self._index.get(key.lower().encode("latin-1"))
        if value is None:
            raise KeyError(key)
        return value.decode("latin-1")

    def __contains__(self, key: Any) -> bool:
        return isinstance(key, str) and key.lower().encode("latin-1") in self._index


class _InferRequest(Request):
    """The `Request` the infer fast path hands its route: headers looked up in a dict."""

    @property
    def headers(self) -> Headers:
        """The request's headers, indexed once."""
        headers = self.__dict__.get("_indexed_headers")
        if headers is None:
            headers = self.__dict__["_indexed_headers"] = _IndexedHeaders(self.scope)
        return headers


class RequestContextMiddleware:
    """Binds each request's ids to its log records and returns them as `X-Request-ID`.

    An exception that escaped the routes becomes a JSON 500 here; the traceback goes to the
    log only.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app for one request, bound to its ids."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _IndexedHeaders(scope)
        context = RequestContext(
            request_id=request_id_from(headers.get("x-request-id")),
            traceparent=traceparent_from(headers.get("traceparent")),
        )
        token = bind_request(context)
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["x-request-id"] = context.request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if status:
                raise
            await unexpected_response()(scope, receive, send_with_id)
        finally:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "request",
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    },
                )
            unbind_request(token)


def _infer_target(path: str) -> tuple[str, str | None] | None:
    """(name, version) of a v2 infer path, as the routes' `{name}` and `{version}` match."""
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[3] and parts[4] == "infer":
        return parts[3], None
    if (
        len(parts) == 7
        and parts[:3] == ["", "v2", "models"]
        and parts[3]
        and parts[4] == "versions"
        and parts[5]
        and parts[6] == "infer"
    ):
        return parts[3], parts[5]
    return None


class InferFastPath:
    """Sends `POST` to a v2 infer path straight to its route body, past FastAPI's router.

    These are the requests that arrive thousands of times a second, and at zero model cost
    FastAPI's route scan, parameter solving and exception wrappers cost about as much as
    the route itself (profiled). The route body maps every error to its answer itself
    (`inference_routes.Routes.observed`), so nothing is lost; other methods and paths go on
    to FastAPI. The innermost middleware: request ids and bearer tokens apply as to any route.
    """

    def __init__(self, app: ASGIApp, *, infer: InferRoute) -> None:
        self.app = app
        self.infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a v2 infer request from its route body; pass anything else on."""
        target = (
            _infer_target(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if target is None:
            await self.app(scope, receive, send)
            return
        response = await self.infer(_InferRequest(scope, receive), *target)
        await response(scope, receive, send)


class BearerAuthMiddleware:
    """401 with `WWW-Authenticate: Bearer` unless the request carries one of the files' tokens.

    The inference listener takes the inference token or the priority token (whoever may
    raise priority may also infer), and any token of the tenants table (`also`); the admin
    listener only the admin token.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: tuple[TokenFile, ...],
        exempt: frozenset[str],
        also: Callable[[bytes | None], bool] | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.exempt = exempt
        self.also = also

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on if it bears a token (or its path is exempt); else a 401."""
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        presented = bearer_token(Headers(scope=scope).get("authorization"))
        if any(token_matches(presented, token.current()) for token in self.tokens) or (
            self.also is not None and self.also(presented)
        ):
            await self.app(scope, receive, send)
            return
        if presented is None:
            refusal = Unauthorized(
                "a bearer token is required", challenge='Bearer realm="fleetserve"'
            )
        else:
            refusal = Unauthorized(
                "the bearer token is not valid",
                challenge='Bearer realm="fleetserve", error="invalid_token"',
            )
        await failure_response(refusal, scope["path"])(scope, receive, send)


class TenantMiddleware:
    """The request's tenant (`Tenancy`): 400 for an untrusted tenant header, 429 over quota.

    The request holds its place in the tenant's quota until its answer is sent, a stream's
    last byte included, and is served with its tenant in `CURRENT_TENANT`, where admission
    (allowed priorities), the engines (fair share, cache salt) and the result cache find it.
    Without a tenants table (`tenancy` None) it only refuses a request naming a tenant.
    """

    def __init__(self, app: ASGIApp, *, tenancy: Tenancy | None, exempt: frozenset[str]) -> None:
        self.app = app
        self.tenancy = tenancy
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request as its tenant's, or answer 400 / 429 for it."""
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        served = served_as_tenant(
            self.tenancy, headers.get("authorization"), headers.get(TENANT_HEADER)
        )
        with ExitStack() as stack:
            # Only entering is a refusal: an error from the app itself is not answered here.
            try:
                stack.enter_context(served)
            except (InvalidInput, TenantOverQuota) as exc:
                await failure_response(exc, scope["path"])(scope, receive, send)
                return
            await self.app(scope, receive, send)
