"""A runtime served in process: the app started under its lifespan, a client over ASGI.

No socket and no thread: requests go through httpx's ASGI transport to the app, on the
test's own event loop. Needs the test dependencies `httpx` and `asgi-lifespan`
(requirements-dev.txt), which the runtime image does not ship: only tests import this.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import SYNTHETIC_MODEL, make_config

__all__ = ["serve"]

STARTUP_TIMEOUT_S = 60.0
"""Time the lifespan may take to start, the first model load excluded (`wait_ready` awaits it)."""
SHUTDOWN_TIMEOUT_S = 30.0
"""Time the lifespan may take to stop the runtime."""


@asynccontextmanager
async def serve(
    model: str = SYNTHETIC_MODEL, **sections: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    """The inference app serving `model` as "test" (`make_config`'s `sections` over it).

    Yields once the first model is loaded: a client talking to the app, and its runtime.
    """
    app = create_app(make_config(model=model, **sections))
    async with LifespanManager(
        app, startup_timeout=STARTUP_TIMEOUT_S, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    ) as manager:
        runtime: Runtime = app.state.runtime
        await runtime.wait_ready()
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rt") as client:
            yield client, runtime
