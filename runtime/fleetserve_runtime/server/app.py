"""The HTTP edge's assembly: the inference and admin apps over one runtime.

Two ASGI apps share one `Runtime` (see `create_apps`):

- the inference app: health, metadata, inference and metrics (`inference_routes`), the
  generation routes (`generation`), OpenAI's embeddings over the encoder (`embeddings`),
  behind an optional bearer token (`auth_token_file`; probes and metrics exempt);
- with `shadow.url` set, a copy of a sample of the inference requests goes to the next
  version and the answers are compared (`shadow`);
- the admin app, only with `model_control: explicit`: the repository load/unload API
  (`repository_routes`), always behind its own bearer token (`admin_token_file`) and the
  `allowed_model_uris` allowlist.

Routes parse and delegate to the runtime through `serving.facade.ServingFacade` (never to its
registry, queue or engine); errors are answered by `responses`, bodies read by
`request_body`, and the `middleware` stack gives every request a request id (its
`X-Request-ID`, or a new one) bound to its log records and returned in its response.

`listener_app` sends each connection to one of them by the local port it arrived on; the CLI
runs one uvicorn server with a socket per listener, so both live in one process, one event
loop and one lifespan. With `grpc_port` set, that lifespan also runs the OIP gRPC server
(`grpc_api`) on the same loop, over the same runtime; with `semantic_cache` on, it loads the
cache's encoder (`openai_cache`) before serving. Each token file is read through one
`TokenFile`, which both protocols share.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetserve_runtime import __version__
from fleetserve_runtime.core.auth import TokenFile
from fleetserve_runtime.core.config import RuntimeConfig
from fleetserve_runtime.core.metrics import ShadowMetrics
from fleetserve_runtime.server.embeddings import register_embeddings
from fleetserve_runtime.server.generation import register_generation
from fleetserve_runtime.server.inference_routes import Routes, register_health, register_inference
from fleetserve_runtime.server.middleware import (
    BearerAuthMiddleware,
    InferFastPath,
    RequestContextMiddleware,
    TenantMiddleware,
)
from fleetserve_runtime.server.openai_cache import SemanticAnswers
from fleetserve_runtime.server.repository_routes import register_repository
from fleetserve_runtime.server.responses import register_error_handlers
from fleetserve_runtime.server.shadow import Shadow, ShadowMirror
from fleetserve_runtime.server.tokenize_routes import register_tokenize
from fleetserve_runtime.serving.admission import Tenancy
from fleetserve_runtime.serving.runtime import Runtime

__all__ = ["Apps", "create_app", "create_apps", "listener_app"]


@dataclass(frozen=True, slots=True)
class Apps:
    """The inference app and, with `model_control: explicit`, the admin app; one runtime."""

    inference: FastAPI
    admin: FastAPI | None


async def _watch_first_load(
    runtime: Runtime,
    on_load_failure: Callable[[BaseException], None] | None,
    on_ready: Callable[[], object] | None,
) -> None:
    try:
        await runtime.wait_ready()
    except Exception as exc:  # any failure of the first load is fatal to the process
        if on_load_failure is not None:
            on_load_failure(exc)
        return
    if on_ready is not None:
        on_ready()


async def _serve_grpc(
    routes: Routes, config: RuntimeConfig, auth_token: TokenFile | None, tenancy: Tenancy | None
) -> Callable[[], Awaitable[None]]:
    # Imported only when gRPC is on: its generated code claims protobuf's `inference.*` names,
    # which a test process using tritonclient.grpc holds already.
    from fleetserve_runtime.server.grpc_api import serve_grpc

    return await serve_grpc(
        routes,
        config,
        server_version=__version__,
        auth_token=auth_token,
        priority_token=routes.priority_token,
        tenancy=tenancy,
    )


def _token_file(path: Path | None) -> TokenFile | None:
    return TokenFile(path) if path is not None else None


def _telemetry(config: RuntimeConfig) -> TelemetryConfig:
    """FastAPI's native OpenTelemetry settings: its defaults, or every signal off."""
    if config.http.opentelemetry:
        return {}
    return {"tracing": False, "metrics": False, "logs": False}


def create_apps(
    config: RuntimeConfig,
    *,
    on_load_failure: Callable[[BaseException], None] | None = None,
    on_ready: Callable[[], object] | None = None,
) -> Apps:
    """Build both apps; the runtime starts in the inference app's lifespan.

    `on_load_failure` is called once if the first model load fails; the CLI stops the
    server then, so a pod whose model cannot load crashes (and says why) instead of
    staying unready until a deadline notices. `on_ready` is called once the first load
    succeeded (the CLI freezes the heap then: `cli.main`).
    """
    auth_token = _token_file(config.auth_token_file)
    routes = Routes(config, priority_token=_token_file(config.priority_token_file))
    tenancy = (
        Tenancy(config.tenants, retry_after_s=config.queue.retry_after_s)
        if config.tenants.file is not None
        else None
    )
    shadow = Shadow(config.shadow) if config.shadow.enabled else None
    answers = (
        SemanticAnswers(
            config.semantic_cache,
            model=config.name,
            default_max_tokens=config.generation.default_max_tokens,
        )
        if config.semantic_cache.enabled
        else None
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(config)
        routes.runtime = runtime
        app.state.runtime = runtime
        if tenancy is not None:
            tenancy.metrics = runtime.metrics.tenants
        await runtime.start()
        if shadow is not None:
            metrics = ShadowMetrics(runtime.metrics.registry, model=config.name, track=config.track)
            shadow.start(metrics, lambda: runtime.active_version or "none")
        watcher = (
            asyncio.create_task(_watch_first_load(runtime, on_load_failure, on_ready))
            if on_load_failure is not None or on_ready is not None
            else None
        )
        stop_grpc = None
        try:
            if answers is not None:
                await answers.load()  # beside the model's load; a failure stops start-up
            if config.grpc_port is not None:
                stop_grpc = await _serve_grpc(routes, config, auth_token, tenancy)
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            if stop_grpc is not None:
                await stop_grpc()
            if shadow is not None:
                await shadow.close()
            await runtime.stop()

    inference_auth = (
        [
            Middleware(
                BearerAuthMiddleware,
                tokens=(
                    auth_token,
                    *([routes.priority_token] if routes.priority_token is not None else []),
                ),
                exempt=frozenset(config.auth_exempt_paths),
                also=tenancy.knows if tenancy is not None else None,
            )
        ]
        if auth_token is not None
        else []
    )
    # Without a table too: a request naming a tenant is refused, never silently served.
    tenants = [
        Middleware(TenantMiddleware, tenancy=tenancy, exempt=frozenset(config.auth_exempt_paths))
    ]
    docs = config.http.api_docs
    telemetry = _telemetry(config)
    inference = FastAPI(
        title="fleetserve-runtime",
        version=__version__,
        lifespan=lifespan,
        telemetry=telemetry,
        docs_url="/docs" if docs else None,
        redoc_url=None,
        openapi_url="/openapi.json" if docs else None,
        middleware=[
            Middleware(RequestContextMiddleware),
            *inference_auth,
            *tenants,
            *([Middleware(ShadowMirror, shadow=shadow)] if shadow is not None else []),
            Middleware(InferFastPath, infer=routes.infer_v2),
        ],
    )
    register_error_handlers(inference)
    register_health(inference, routes, server_version=__version__)
    register_inference(inference, routes)
    register_generation(inference, routes, answers)
    register_embeddings(inference, routes)
    register_tokenize(inference, routes)
    admin = None
    if config.model_control == "explicit" and config.admin_token_file is not None:
        admin = FastAPI(
            title="fleetserve-runtime model control",
            version=__version__,
            telemetry=telemetry,
            docs_url=None,
            redoc_url=None,
            openapi_url=None,
            middleware=[
                Middleware(RequestContextMiddleware),
                Middleware(
                    BearerAuthMiddleware,
                    tokens=(TokenFile(config.admin_token_file),),
                    exempt=frozenset(),
                ),
            ],
        )
        register_error_handlers(admin)
        register_repository(admin, routes)
    return Apps(inference=inference, admin=admin)


def create_app(config: RuntimeConfig) -> FastAPI:
    """The inference app alone (health, metadata, inference, metrics); see `create_apps`."""
    return create_apps(config).inference


def listener_app(apps: Apps, *, admin_port: int | None) -> ASGIApp:
    """One ASGI app for the server: connections to `admin_port` reach the admin app.

    The local port a connection arrived on is set by the kernel, so no header can steer a
    request from the inference listener to the admin app. Lifespan events go to the
    inference app, which owns the runtime.
    """
    if apps.admin is None or admin_port is None:
        return apps.inference
    admin, inference = apps.admin, apps.inference

    async def by_listener(scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == admin_port:
            await admin(scope, receive, send)
        else:
            await inference(scope, receive, send)

    return by_listener
