"""Domain errors of the operator; `handlers` maps them to kopf's retry policy in one place.

`InvalidSpec` and `ChildRefused` are permanent (only a new spec helps); `DependencyMissing`,
`ChildConflict`, `ClusterUnavailable` and `MetricsUnavailable` are temporary (retried with
back-off). The `SpecError`s name the spec field at fault, and that name reaches the
`Degraded` condition.

Every error's text is cut at `MESSAGE_LIMIT`: it reaches status, Events and kopf's progress
annotations, and what it quotes (an API server's refusal, a key of the object) can be
megabytes long.
"""

from __future__ import annotations

__all__ = [
    "MESSAGE_LIMIT",
    "ChildConflict",
    "ChildRefused",
    "ClusterUnavailable",
    "DependencyMissing",
    "FleetserveError",
    "InvalidSpec",
    "MetricsUnavailable",
    "SpecError",
    "bounded",
]

MESSAGE_LIMIT = 1024
"""Longest text the operator writes into status or an Event, or raises as an error."""


def bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` when it has at most `limit` characters, else its start and an ellipsis (`limit`)."""
    return text if len(text) <= limit else text[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"


class FleetserveError(Exception):
    """Base of the operator's domain errors; its text is `bounded`."""

    def __init__(self, message: str) -> None:
        super().__init__(bounded(message))


class SpecError(FleetserveError):
    """Something the spec asks for cannot be done; `field` names where, `reason` says what."""

    reason = "InvalidSpec"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = bounded(message)


class InvalidSpec(SpecError):
    """The spec passed the schema but can never be deployed (e.g. an unknown builtin model)."""

    reason = "InvalidSpec"


class DependencyMissing(SpecError):
    """An object the spec relies on does not exist yet (a PVC, the HTTPRoute API)."""

    reason = "DependencyMissing"


class ChildConflict(SpecError):
    """A child's name is taken by an object this InferenceService does not control.

    The operator leaves that object untouched; deleting or renaming it (or renaming the
    InferenceService) lets the next reconcile go on.
    """

    reason = "ChildConflict"

    def __init__(self, kind: str, namespace: str, name: str) -> None:
        super().__init__(
            "metadata.name",
            f"{kind} {namespace}/{name} already exists and is not controlled by this "
            "InferenceService; it was left untouched",
        )


class ChildRefused(InvalidSpec):
    """The API server refused a child rendered from the spec (schema, admission, quota)."""

    reason = "ChildRefused"

    def __init__(self, field: str, kind: str, name: str, message: str) -> None:
        super().__init__(field, f"{kind} {name} refused by the API server: {message}")


class ClusterUnavailable(FleetserveError):
    """The API server could not be reached or failed; retry later."""


class MetricsUnavailable(FleetserveError):
    """Prometheus could not be reached or a query failed; the check is inconclusive."""
