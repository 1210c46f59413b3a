"""Build the storage servers the model-fetch tests run against (``make storage-tools``).

SeaweedFS's ``weed`` (an S3 server; MinIO's server is AGPL and is not used) and CNCF
Distribution's ``registry`` (an OCI registry) are the unmodified upstream commands, each built
from its own pinned Go module under ``e2e/storage-tools/`` so that neither moves the other's
dependency versions (one module would lift 65 of Distribution's 110 requirements to SeaweedFS's
newer ones). They are built only when a test asks for them (`ensure_seaweedfs`,
`ensure_registry`), at low priority, into ``~/.cache/fleetserve/bin/<name>-<version>/``, and
skipped when already there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetserve_e2e.paths import E2E_DIR, cache_dir, pinned_version
from fleetserve_e2e.toolchain import build_binary

STORAGE_TOOLS_DIR = E2E_DIR / "storage-tools"
# The builds run beside tests on a shared machine: they yield the CPU to anything else.
BUILD_NICENESS = 10


@dataclass(frozen=True)
class GoCommand:
    """One upstream Go command, pinned by a tools module and cached once built.

    Args:
        label: Names the cache directory (``<label>-<version>``) and the progress lines.
        binary_name: The file name of the built command.
        module: The Go module that holds the command.
        package: The command's Go package.
        tools_module: The directory of the go.mod that pins ``module``.
        stamp: Linker ``-X`` flags that stamp the pinned version, as the upstream release
            build does, so the command reports what it is.
        prepare: For a command the tools module alone cannot build: writes, when a build
            starts, the go.mod to build with instead (``go build -modfile``) and returns it.
    """

    label: str
    binary_name: str
    module: str
    package: str
    tools_module: Path
    stamp: Callable[[str], str]
    prepare: Callable[[GoCommand], Path] | None = None

    def version(self) -> str:
        """The version the tools module pins."""
        return pinned_version(self.module, self.tools_module)

    def binary(self) -> Path:
        """Where the built command is (or will be) cached."""
        return cache_dir() / "bin" / f"{self.label}-{self.version()}" / self.binary_name

    def ldflags(self) -> str:
        """Stripped, and version-stamped."""
        return f"-s -w {self.stamp(self.version())}"


def _seaweedfs_stamp(version: str) -> str:
    # SeaweedFS publishes no tags to the module proxy: its pseudo-version ends with the
    # commit, which its release build stamps into COMMIT (`weed version` prints it).
    commit = version.rsplit("-", 1)[-1]
    return f"-X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT={commit}"


def _registry_stamp(version: str) -> str:
    return f"-X github.com/distribution/distribution/v3/version.version={version}"


SEAWEEDFS = GoCommand(
    label="seaweedfs",
    binary_name="weed",
    module="github.com/seaweedfs/seaweedfs",
    package="github.com/seaweedfs/seaweedfs/weed",
    tools_module=STORAGE_TOOLS_DIR / "seaweedfs",
    stamp=_seaweedfs_stamp,
)
REGISTRY = GoCommand(
    label="registry",
    binary_name="registry",
    module="github.com/distribution/distribution/v3",
    package="github.com/distribution/distribution/v3/cmd/registry",
    tools_module=STORAGE_TOOLS_DIR / "distribution",
    stamp=_registry_stamp,
)


def ensure_command(command: GoCommand) -> Path:
    """Return the command's binary, building it first when missing (minutes on a cold cache)."""
    target = command.binary()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"{command.label}: building {command.package}@{command.version()} ...", flush=True)
    started = time.monotonic()
    modfile = None if command.prepare is None else command.prepare(command)
    build_binary(
        command.binary_name,
        command.package,
        target.parent,
        module=command.tools_module,
        flags=command.ldflags(),
        niceness=BUILD_NICENESS,
        modfile=modfile,
    )
    print(f"{command.label}: built in {time.monotonic() - started:.0f}s", flush=True)
    return target


def ensure_seaweedfs() -> Path:
    """Return SeaweedFS's ``weed``, building it when missing."""
    return ensure_command(SEAWEEDFS)


def ensure_registry() -> Path:
    """Return Distribution's ``registry``, building it when missing."""
    return ensure_command(REGISTRY)


def build_storage_tools() -> list[Path]:
    """Build whichever of the two is missing and return both binaries."""
    binaries = [ensure_registry(), ensure_seaweedfs()]
    for binary in binaries:
        print(f"storage-tools: {binary}", flush=True)
    return binaries
