"""Where the harness finds its pinned versions, built binaries and long-lived state.

Everything here derives from the go.mod files of the tools modules (``e2e/tools`` pins the
Kubernetes binaries; ``kwok-tools``, ``keda-tools`` and ``storage-tools/*`` beside it pin
theirs) and from the user's cache directory, so builds survive ``git clean`` and are shared by
checkouts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = E2E_DIR.parent
TOOLS_DIR = E2E_DIR / "tools"

_REQUIRE = re.compile(r"^\s*(?:require\s+)?(\S+)\s+(v\S+)", re.MULTILINE)


def pinned_version(module: str, tools_module: Path = TOOLS_DIR) -> str:
    """Return the version the go.mod of ``tools_module`` (``e2e/tools``) pins for ``module``.

    Raises:
        LookupError: The module is not required by that go.mod.
    """
    go_mod = tools_module / "go.mod"
    for path, version in _REQUIRE.findall(go_mod.read_text(encoding="utf-8")):
        if path == module:
            return str(version)
    raise LookupError(f"{module} is not pinned in {go_mod}")


def cache_dir() -> Path:
    """Return ``$XDG_CACHE_HOME/fleetserve`` (default ``~/.cache/fleetserve``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetserve"


def bin_dir() -> Path:
    """Return the directory holding binaries built for the pinned Kubernetes version."""
    return cache_dir() / "bin" / pinned_version("k8s.io/kubernetes")


def binary(name: str) -> Path:
    """Return the path of a built tool, failing with the command that builds it.

    Raises:
        FileNotFoundError: The tools have not been built yet.
    """
    path = bin_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; build the tools first with `make tools`")
    return path


def state_dir(component: str) -> Path:
    """Return the directory where a background ``make <component>-up`` records its state."""
    return cache_dir() / component
