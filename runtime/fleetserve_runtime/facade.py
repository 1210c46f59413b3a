"""What the HTTP API may ask of the runtime: the `ServingFacade` protocol.

`api` types its routes against this protocol, never against `Runtime`'s parts (its registry,
queue or engine), so the runtime can change how it schedules, or which engine serves a
model, without touching a route. `Runtime` implements it.
"""

from __future__ import annotations

from typing import Any, Protocol

from fleetserve_runtime.encoder_engine import InferenceCall, InferenceResult
from fleetserve_runtime.liveness import Liveness
from fleetserve_runtime.metrics import RuntimeMetrics
from fleetserve_runtime.models.registry import LoadedModel

__all__ = ["ServingFacade"]


class ServingFacade(Protocol):
    """Inference, model metadata, health and model control of one served model name."""

    @property
    def metrics(self) -> RuntimeMetrics:
        """The runtime's metrics: requests are counted here, `/metrics` renders its registry."""
        ...

    async def infer(self, call: InferenceCall) -> InferenceResult:
        """Run one request; raises the runtime's domain errors."""
        ...

    def model(self, version: str | None) -> LoadedModel:
        """The active version, or a loaded one by label (`ModelNotFound`, `ModelNotReady`)."""
        ...

    def versions(self) -> list[str]:
        """Loaded version labels."""
        ...

    @property
    def active_version(self) -> str | None:
        """The version new requests go to; None before the first load."""
        ...

    def describe(self, model: LoadedModel) -> dict[str, Any]:
        """Measured memory figures and limits for the model metadata endpoint."""
        ...

    @property
    def is_ready(self) -> bool:
        """True once a version is loaded and warmed and requests are accepted."""
        ...

    @property
    def load_failed(self) -> BaseException | None:
        """The initial load's error, if it failed."""
        ...

    def liveness(self) -> Liveness:
        """Whether the runtime still makes progress."""
        ...

    async def load_version(self, uri: str, version: str) -> LoadedModel:
        """Load and activate `version` from `uri` (or re-activate it when already loaded)."""
        ...

    def release_previous(self) -> str | None:
        """Unload the previous version; returns its label (None if there was none)."""
        ...
