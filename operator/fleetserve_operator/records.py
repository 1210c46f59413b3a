"""Plain records the layers hand each other: manifests, problems, Events, memory figures.

They sit below every other module so that the adapters (`kube`, `analysis`) and the pure
decisions (`facts`, `observe`) can share them without importing one another: `analysis`
returns `MemoryFigures` that `observe` judges, `observe` returns `EventNote`s that `kube`
posts, and `facts` and `observe` report `Problem`s that `sync` turns into status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EventNote", "Manifest", "MemoryFigures", "Problem"]

Manifest = dict[str, Any]
"""A Kubernetes object (or part of one) in the API's own JSON shape."""


@dataclass(frozen=True, slots=True)
class Problem:
    """Why the service is Degraded: the condition's reason and a message naming the field."""

    reason: str
    message: str
    permanent: bool = False
    """Only a new spec can fix it: the phase is Failed."""


@dataclass(frozen=True, slots=True)
class MemoryFigures:
    """What the runtime measured when it loaded the model (its `fleetserve_model_*` gauges)."""

    weights_bytes: float
    fixed_bytes: float
    bytes_per_token: float


@dataclass(frozen=True, slots=True)
class EventNote:
    """An Event to post on the InferenceService."""

    type: str
    """`Normal` or `Warning`."""
    reason: str
    message: str
