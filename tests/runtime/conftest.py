"""Runtime-tier pytest hooks and shared fixtures.

Tests marked `gpu` skip cleanly without CUDA; `serve_with_admin` starts a runtime with model
control for the tests that load versions.

This lives here, not in tests/conftest.py, because it imports torch: the operator tier
(`pytest tests/operator`) must run without it, as the operator image has no torch.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from asgi_lifespan import LifespanManager

from fleetserve_runtime.api import create_apps
from fleetserve_runtime.runtime import Runtime
from fleetserve_runtime.testing import make_config

ADMIN_TOKEN = "admin-secret-0123456789"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `gpu` when no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@asynccontextmanager
async def _serve_with_admin(
    allowed: str = "builtin://synthetic", **overrides: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, Runtime]]:
    """A started runtime with model control on, an inference client and an admin client.

    The admin client sends the admin token; `allowed` is the model-URI allowlist.
    """
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "admin-token"
        token_file.write_text(ADMIN_TOKEN)
        config = make_config(
            model_control="explicit",
            admin_token_file=token_file,
            allowed_model_uris=allowed,
            **overrides,
        )
        apps = create_apps(config)
        assert apps.admin is not None
        async with LifespanManager(apps.inference, startup_timeout=60) as manager:
            runtime: Runtime = apps.inference.state.runtime
            await runtime.wait_ready()
            inference = httpx.ASGITransport(app=manager.app)
            admin = httpx.ASGITransport(app=apps.admin)
            headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            async with (
                httpx.AsyncClient(transport=inference, base_url="http://rt") as client,
                httpx.AsyncClient(transport=admin, base_url="http://admin", headers=headers) as ctl,
            ):
                yield client, ctl, runtime


@pytest.fixture
def serve_with_admin() -> Callable[
    ..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, httpx.AsyncClient, Runtime]]
]:
    """`_serve_with_admin`, for tests that load, swap and unload versions."""
    return _serve_with_admin
