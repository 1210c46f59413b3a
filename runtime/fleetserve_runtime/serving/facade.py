"""What the HTTP API may ask of the runtime: the `ServingFacade` protocol.

`api` types its routes against this protocol, never against `Runtime`'s parts (its registry,
queue or engine), so the runtime can change how it schedules, or which engine serves a
model, without touching a route. `Runtime` implements it. `GenerationEvents` and
`GenerativeModelInfo` are the shapes its generation methods return, as the routes use them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from fleetserve_runtime.core.liveness import Liveness
from fleetserve_runtime.core.metrics import RuntimeMetrics
from fleetserve_runtime.encoder.engine import InferenceCall, InferenceResult
from fleetserve_runtime.generate.contracts import GenerationEvent, GenerationRequest
from fleetserve_runtime.models.registry import LoadedModel

__all__ = ["GenerativeModelInfo", "GenerationEvents", "ServingFacade"]


class GenerationEvents(Protocol):
    """One accepted generation: its events, in order, until a finish or an error event.

    Iterating may raise a domain error before the first event (the deadline passed while
    queued); after that, failures arrive as `ErrorEvent`s.
    """

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt, as the model's tokenizer counted them."""
        ...

    def __aiter__(self) -> AsyncIterator[GenerationEvent]: ...

    async def aclose(self) -> None:
        """Cancel: the sequence leaves the batch within one step and frees its KV blocks.

        Safe to call at any time, also after the stream ended.
        """
        ...


class GenerativeModelInfo(Protocol):
    """What the generation routes need to know about the served generative model."""

    @property
    def context_length(self) -> int:
        """Most tokens of prompt plus output one sequence may hold."""
        ...

    @property
    def version(self) -> str:
        """The version label new generations go to."""
        ...


class ServingFacade(Protocol):
    """Inference, model metadata, health and model control of one served model name."""

    @property
    def metrics(self) -> RuntimeMetrics:
        """The runtime's metrics: requests are counted here, `/metrics` renders its registry."""
        ...

    async def infer(self, call: InferenceCall) -> InferenceResult:
        """Run one request; raises the runtime's domain errors."""
        ...

    async def generate(self, request: GenerationRequest) -> GenerationEvents:
        """Admit one generation; raises before any event when it cannot be admitted.

        `ModelNotFound` / `ModelNotReady` for the version, `InvalidInput` when the model does
        not generate, `InputTooLong` when prompt plus `max_tokens` exceed the context,
        `QueueFull` when the waiting queue is at its bound.
        """
        ...

    @property
    def is_generative(self) -> bool:
        """True when the active version generates text (the generation routes serve it)."""
        ...

    def generation_info(self) -> GenerativeModelInfo:
        """The active generative version's limits; `InvalidInput` when it does not generate."""
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
