"""The admin app's model-repository API: load and unload versions of the served model.

Mounted only with `model_control: explicit`, behind the admin token (`app`). A URI other
than the configured model must pass the `allowed_model_uris` allowlist (`core.auth.uri_refusal`)
before anything is loaded; a load that fails tells the caller why without leaking paths or
tracebacks, which go to the log under an error id.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from fastapi import FastAPI, Request, Response

from fleetserve_runtime.core.auth import uri_refusal
from fleetserve_runtime.core.errors import FleetserveError, Forbidden, InvalidInput
from fleetserve_runtime.server.http_errors import json_response
from fleetserve_runtime.server.inference_routes import Routes
from fleetserve_runtime.server.schemas import LoadRequest, decode_body

__all__ = ["register_repository"]

log = logging.getLogger("fleetserve.api")


def _is_directory(path: str) -> bool:
    return Path(path).is_dir()


def _load_failure(uri: str, exc: Exception) -> InvalidInput:
    """The caller's error for a load that raised; internals (paths, tracebacks) stay in the log."""
    if isinstance(exc, ValueError | ModuleNotFoundError):
        return InvalidInput(f"cannot load {uri!r}: {exc}")
    error_id = uuid.uuid4().hex[:12]
    log.error("model load failed", exc_info=exc, extra={"uri": uri, "error_id": error_id})
    return InvalidInput(f"cannot load {uri!r}: {type(exc).__name__} (error id {error_id})")


def register_repository(app: FastAPI, routes: Routes) -> None:
    """Mount `POST /v2/repository/models/{name}/load` and `.../unload`."""
    config = routes.config

    @app.post("/v2/repository/models/{name}/load")
    async def load(request: Request, name: str) -> Response:
        routes.check_name(name)
        raw = await routes.body(request)
        body = decode_body(raw, LoadRequest)
        uri = body.parameters.uri or config.model
        if uri != config.model:
            refusal = uri_refusal(
                uri,
                config.allowed_model_uris,
                is_directory=_is_directory,
                real_path=os.path.realpath,
            )
            if refusal is not None:
                raise Forbidden(refusal)
        try:
            loaded = await routes.rt.load_version(uri, body.parameters.version)
        except FleetserveError:
            raise
        except Exception as exc:  # user code: any failure means "cannot load"
            raise _load_failure(uri, exc) from None
        return json_response({"name": name, "active_version": loaded.version})

    @app.post("/v2/repository/models/{name}/unload")
    async def unload(name: str) -> Response:
        routes.check_name(name)
        released = routes.rt.release_previous()
        return json_response({"name": name, "released_version": released})
