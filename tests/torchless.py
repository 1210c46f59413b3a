"""A pytest plugin that makes torch impossible to import: the operator tier runs under it.

The operator image has no torch, and its tests must not need it either: a conftest or test
that imports torch would make `pytest tests/operator` pay for it and hide the day the
operator itself starts to depend on it. Loaded with `-p tests.torchless` (by `make unit`, on
every xdist worker), it refuses `import torch` with an ImportError and records where from,
and fails the test that asked (or the run, when collection asked), so an attempt that the
caller catches still shows.
"""

from __future__ import annotations

import importlib.abc
import sys
import traceback
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pytest

REFUSED = "torch"


class _NoTorch(importlib.abc.MetaPathFinder):
    """Refuses torch and its submodules; keeps the stack of each attempt."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname == REFUSED or fullname.startswith(REFUSED + "."):
            frames = [
                frame
                for frame in traceback.format_stack()
                if "<frozen" not in frame and __file__ not in frame
            ]
            self.attempts.append("".join(frames[-5:]))
            raise ImportError(f"the operator tier must not import {REFUSED}")
        return None


if REFUSED in sys.modules:
    raise pytest.UsageError(f"{REFUSED} was imported before the torchless plugin could refuse it")
_FINDER = _NoTorch()
sys.meta_path.insert(0, _FINDER)


def _where() -> str:
    """The first recorded attempt's stack, forgetting them all."""
    where = _FINDER.attempts[0]
    _FINDER.attempts.clear()
    return f"{REFUSED} was imported from:\n{where}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fails the test that asked for torch, even when it caught the refusal."""
    _FINDER.attempts.clear()
    yield
    if _FINDER.attempts:
        pytest.fail(_where(), pytrace=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stops a run whose collection asked for torch but caught the refusal.

    A module that imports torch at its top already fails to collect, which says so.
    """
    if _FINDER.attempts and not session.testsfailed:
        pytest.exit(_where(), returncode=pytest.ExitCode.USAGE_ERROR)
    _FINDER.attempts.clear()
