"""Fleetserve runtime: a dynamic-batching inference server (Open Inference Protocol, HTTP and gRPC).

Public surface: `create_app`, `RuntimeConfig`, `ModelHandler`. Everything else is internal.

Packages, each importing only those below it (`make lint` checks this with import-linter):
`cli | testing → server → serving → encoder | generate → models | storage → core`.

- `cli` (and `__main__`): argv and environment to a `RuntimeConfig`; starts uvicorn.
- `server`: the edge. App assembly and middlewares, the OIP routes, the OpenAI routes and
  their SSE streams, binary tensors, gRPC (and its generated `oip`), the hardened HTTP
  protocol, the error → status table, the JSON schemas. The only FastAPI, Starlette,
  uvicorn, grpc and protobuf user besides `cli`; it reaches the runtime through
  `serving.facade.ServingFacade`.
- `serving`: one served model. The `Runtime`, the facade, versions (load, warm, swap, drain)
  and admission (who may raise a request's priority and deadline).
- `encoder` and `generate`: the two engines, which never import each other. `encoder`:
  dynamic batching (pure `request_queue` and `batcher`, the `executor`, the `engine`).
  `generate`: continuous batching over a paged KV cache (pure `blocks`, `scheduler` and
  `stops`, `sampling`, `metrics`, the `engine`).
- `models`: the handler protocol (`models.base`), the registry, the encoders, ONNX (the only
  onnxruntime user), precision, the causal-LM protocol the generative engine steps, and
  `models.llama`; it imports neither engine.
- `storage`: the storage initializer (`fleetserve-runtime fetch`, an init container): a model
  from `s3://`, `oci://`, `https://` or `hf://` into a volume, all or nothing; it imports
  nothing of the serving side.
- `core`: config, metrics, memory budget, cache, errors, logs, limits, liveness, auth, JSON
  limits, priority classes. torch stays in `encoder`, `generate`, `models` and `core.memory`.
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
