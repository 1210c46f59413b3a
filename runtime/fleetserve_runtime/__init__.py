"""Fleetserve runtime: a dynamic-batching inference server (Open Inference Protocol, HTTP and gRPC).

Public surface: `create_app`, `RuntimeConfig`, `ModelHandler`. Everything else is internal.

Layers, each importing only those below it (`make lint` checks this with import-linter):
`cli → api → generation_api | grpc_api → sse | generation_schemas → http_errors →
http_protocol → runtime → facade → versions | encoder_engine → executor → batcher →
models : generate → request_queue | memory | cache | metrics → liveness → config | limits |
binary_tensors → auth | logs | schemas → errors | oip` (`models : generate`: the registry
resolves generative URIs, a generative handler describes itself with the models' metadata
types). Only the HTTP edge (`api`, `generation_api`, `sse`, `schemas`, `http_protocol`,
`cli`) uses FastAPI, Starlette or uvicorn; grpc and protobuf appear only in `grpc_api` and
its generated `oip`; torch stays in `executor`, `memory`, `models` and `generate`;
`batcher`, `request_queue` and the generative engine's decisions (`generate.blocks`,
`generate.scheduler`, `generate.stops`) are pure (no asyncio, no threads, no torch). `api`
reaches the runtime only through `facade.ServingFacade`. The engine-agnostic core
(`request_queue`, `metrics`, `memory`, `cache`, the model registry) is shared by two
engines: `encoder_engine` (dynamic batching) and `generate.engine` (continuous batching over
a paged KV cache).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["ModelHandler", "RuntimeConfig", "__version__", "create_app"]

if TYPE_CHECKING:
    from fleetserve_runtime.core.config import RuntimeConfig
    from fleetserve_runtime.models.base import ModelHandler
    from fleetserve_runtime.server.app import create_app


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (e.g. for `--help`) must not pay for torch and FastAPI.
    if name == "create_app":
        from fleetserve_runtime.server.app import create_app

        return create_app
    if name == "RuntimeConfig":
        from fleetserve_runtime.core.config import RuntimeConfig

        return RuntimeConfig
    if name == "ModelHandler":
        from fleetserve_runtime.models.base import ModelHandler

        return ModelHandler
    msg = f"module 'fleetserve_runtime' has no attribute {name!r}"
    raise AttributeError(msg)
