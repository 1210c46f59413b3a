"""The context-manager shape every long-lived harness part shares.

A cluster, Prometheus and KEDA each start several things in order. If any step fails, what
already started must stop before the error propagates, or its processes and temp dirs outlive
the test; ``close`` is therefore idempotent and safe on a half-started component.
"""

from __future__ import annotations

import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

T = TypeVar("T")


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


class WorkDir:
    """A component's work dir: the one its caller gave, else a temp dir the component owns.

    A given dir is the caller's and outlives the component (its logs stay to be read); an
    owned one is made at start and removed at close, so a test leaves no temp dir behind.
    """

    def __init__(self, given: Path | None, *, prefix: str) -> None:
        """Name the dir; an owned one is made by the first ``make``, named after ``prefix``."""
        self._path = given
        self._owned = given is None
        self._prefix = prefix

    def make(self) -> Path:
        """The dir: the given one, or the owned one, made on the first call."""
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix=self._prefix))
        return self._path

    def remove(self) -> None:
        """Remove an owned dir that was made (idempotent); a given one stays."""
        if self._owned and self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)


def started(value: T | None, what: str) -> T:
    """Return what a component made at start.

    Raises:
        RuntimeError: ``value`` is None: ``what`` has not started.
    """
    if value is None:
        raise RuntimeError(f"{what} has not started")
    return value
