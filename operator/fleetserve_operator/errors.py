"""Domain errors of the operator; `handlers` maps them to kopf's retry policy in one place.

`InvalidSpec` is permanent (only a new spec helps); `DependencyMissing`, `ClusterUnavailable`
and `MetricsUnavailable` are temporary (retried with back-off). The first two name the spec
field at fault, and that name reaches the `Degraded` condition.
"""

from __future__ import annotations

__all__ = [
    "ClusterUnavailable",
    "DependencyMissing",
    "FleetserveError",
    "InvalidSpec",
    "MetricsUnavailable",
    "SpecError",
]


class FleetserveError(Exception):
    """Base of the operator's domain errors."""


class SpecError(FleetserveError):
    """Something the spec asks for cannot be done; `field` names where, `reason` says what."""

    reason = "InvalidSpec"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InvalidSpec(SpecError):
    """The spec passed the schema but can never be deployed (e.g. an unknown builtin model)."""

    reason = "InvalidSpec"


class DependencyMissing(SpecError):
    """An object the spec relies on does not exist yet (a PVC, the HTTPRoute API)."""

    reason = "DependencyMissing"


class ClusterUnavailable(FleetserveError):
    """The API server could not be reached or failed; retry later."""


class MetricsUnavailable(FleetserveError):
    """Prometheus could not be reached or a query failed; the check is inconclusive."""
