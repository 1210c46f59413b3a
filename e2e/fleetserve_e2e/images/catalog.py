"""The three images ``make images`` builds, what each is built with, and the size it may reach.

Pure: the build arguments and bounds are decided here, podman runs them elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from fleetserve_e2e.paths import REPO_DIR

VERSION = "0.1.0"
"""The version the images are tagged with (the packages' and the chart's)."""
REPOSITORY = "localhost/fleetserve"
"""Where local builds are tagged (a registry retags them: see docs/how-to/build-images.md)."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MB = 1_000_000


class ImagePlanError(ValueError):
    """An image cannot be built as asked; the message says what is missing."""


@dataclass(frozen=True)
class ImageSpec:
    """One image: its name, Dockerfile, build arguments and the largest size it may have."""

    name: str
    dockerfile: Path
    tag: str
    build_args: dict[str, str] = field(default_factory=dict)
    max_bytes: int | None = None
    """None: reported, not bounded (the GPU image is as large as NVIDIA's libraries are)."""


OPERATOR = "operator"
RUNTIME_GPU = "runtime-gpu"
RUNTIME_CPU = "runtime-cpu"
NAMES = (OPERATOR, RUNTIME_GPU, RUNTIME_CPU)


def image_tag(name: str) -> str:
    """The local tag of image ``name``: the CPU track is the runtime image's ``-cpu`` tag."""
    if name == RUNTIME_CPU:
        return f"{REPOSITORY}/fleetserve-runtime:{VERSION}-cpu"
    repository = "fleetserve-operator" if name == OPERATOR else "fleetserve-runtime"
    return f"{REPOSITORY}/{repository}:{VERSION}"


def plan(
    names: tuple[str, ...], *, base: str, revision: str, torch_cpu_sha256: str = ""
) -> list[ImageSpec]:
    """The specs of ``names``, in the order given, all built on ``base``.

    Raises:
        ImagePlanError: An unknown name, or the CPU track without the hash of torch's CPU
            wheel (that wheel is not on PyPI, so no lock can hold its hash).
    """
    unknown = [name for name in names if name not in NAMES]
    if unknown:
        raise ImagePlanError(f"unknown image {unknown[0]!r}; the images are {', '.join(NAMES)}")
    common = {"PYTHON_IMAGE": base, "REVISION": revision, "VERSION": VERSION}
    specs = []
    for name in names:
        if name == OPERATOR:
            specs.append(
                ImageSpec(
                    name,
                    REPO_DIR / "Dockerfile.operator",
                    image_tag(name),
                    dict(common),
                    max_bytes=250 * MB,
                )
            )
        elif name == RUNTIME_GPU:
            specs.append(
                ImageSpec(
                    name,
                    REPO_DIR / "Dockerfile.runtime",
                    image_tag(name),
                    {**common, "TRACK": "gpu"},
                )
            )
        else:
            if not _SHA256.match(torch_cpu_sha256):
                raise ImagePlanError(
                    "runtime-cpu needs TORCH_CPU_SHA256: the sha256 of the cp311 manylinux x86_64"
                    " wheel of torch's CPU build (the lock's torch version, `+cpu`), which only"
                    " PyTorch's own index serves (Dockerfile.runtime's TORCH_CPU_INDEX)"
                )
            specs.append(
                ImageSpec(
                    name,
                    REPO_DIR / "Dockerfile.runtime",
                    image_tag(name),
                    {**common, "TRACK": "cpu", "TORCH_CPU_SHA256": torch_cpu_sha256},
                    max_bytes=1500 * MB,
                )
            )
    return specs


def within_bound(spec: ImageSpec, size_bytes: int) -> bool:
    """Whether an image of ``size_bytes`` meets its spec's bound (an unbounded one always does)."""
    return spec.max_bytes is None or size_bytes <= spec.max_bytes
