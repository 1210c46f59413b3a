"""The context-manager shape every long-lived harness part shares.

A cluster, Prometheus and KEDA each start several things in order. If any step fails, what
already started must stop before the error propagates, or its processes and temp dirs outlive
the test; ``close`` is therefore idempotent and safe on a half-started component.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Component(ABC):
    """Start on ``__enter__`` (cleaning up after a failed start), ``close`` on ``__exit__``."""

    @abstractmethod
    def _start(self) -> None:
        """Start everything and wait until it is ready."""

    @abstractmethod
    def close(self) -> None:
        """Stop whatever has started (idempotent)."""

    def __enter__(self) -> Self:
        """Start, or close what did start and re-raise."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop everything."""
        self.close()
