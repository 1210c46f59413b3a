"""What every protocol surface takes from `inference_routes.Routes`, whichever it serves.

The generation routes and the gRPC service each add what only they need (`RouteHost`,
`GrpcHost`); the runtime, the name check and the request count are one interface.
"""

from __future__ import annotations

from typing import Protocol

from fleetserve_runtime.serving.facade import ServingFacade


class ModelHost(Protocol):
    """The served model's runtime, its name check and its request metrics."""

    @property
    def rt(self) -> ServingFacade:
        """The runtime (`ModelNotReady` while the server starts)."""
        ...

    def check_name(self, name: str) -> None:
        """`ModelNotFound` unless `name` is the served model's name."""
        ...

    def count(self, version: str | None, code: int, seconds: float) -> None:
        """Count one answered request in the request metrics."""
        ...
