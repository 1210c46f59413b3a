"""Plain records the layers hand each other: manifests, problems, Events, memory figures, time.

They sit below every other module so that the adapters (`kube`, `analysis`) and the pure
decisions (`observe`, `rollout`) can share them without importing one another: `analysis`
returns `MemoryFigures` that `observe` judges, `observe` and `rollout` return `EventNote`s that
`kube` posts, and `observe` reports `Problem`s that `sync` turns into status.
`rfc3339` is the one spelling of a timestamp the operator writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar, cast

__all__ = [
    "EventNote",
    "Manifest",
    "MemoryFigures",
    "Problem",
    "TrackFetch",
    "json_copy",
    "rfc3339",
]

Manifest = dict[str, Any]
"""A Kubernetes object (or part of one) in the API's own JSON shape."""


_Json = TypeVar("_Json")


def json_copy(value: _Json) -> _Json:
    """A deep copy of JSON-shaped data (dicts, lists, scalars) for a reader to edit freely.

    Four times faster than `copy.deepcopy`, which keeps a memo for shared and cyclic
    references that a decoded API object never has: the operator copies its cached
    children and InferenceServices on every reconcile.
    """
    return cast(_Json, _copied(value))


def _copied(value: Any) -> Any:
    if type(value) is dict:
        return {key: _copied(item) for key, item in value.items()}
    if type(value) is list:
        return [_copied(item) for item in value]
    return value


@dataclass(frozen=True, slots=True)
class Problem:
    """Why the service is Degraded: the condition's reason and a message naming the field."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class TrackFetch:
    """Where the model fetch of one track's current pods stands (fetched models only)."""

    pods: int
    """Current pods of the track; each fetches the model in its init container."""
    fetched: int
    """Those whose fetch completed."""
    digests: tuple[str, ...] = ()
    """The distinct digests the completed fetches reported, sorted: one when the track
    serves one set of bytes."""
    failure: Problem | None = None
    """The first current pod's failed fetch, in the fetch's own words."""
    cache: tuple[str, ...] = ()
    """What the node cache did for each completed fetch that used one (`hit`, `stored`,
    `present`, `unwritable`), sorted."""


@dataclass(frozen=True, slots=True)
class MemoryFigures:
    """What the runtime measured when it loaded the model (its `fleetserve_model_*` gauges)."""

    weights_bytes: float
    fixed_bytes: float
    bytes_per_token: float
    kv_cache_blocks: float | None = None
    """Blocks of a generative version's KV-cache pool (part of `fixed_bytes`); None for an
    encoder, or before the runtime reported them."""
    kv_cache_block_bytes: float | None = None
    """Bytes of one of those blocks."""


@dataclass(frozen=True, slots=True)
class EventNote:
    """An Event to post on the InferenceService."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def rfc3339(moment: datetime) -> str:
    """`moment` as metav1 writes timestamps: RFC 3339, UTC, whole seconds (`...T10:00:00Z`)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
