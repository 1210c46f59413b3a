"""The runtime's images: one per track kind, built from one Dockerfile, and their defaults.

The GPU tracks (stable, canary) run the CUDA build, the CPU fallback the CPU-only build,
tagged like it with a `-cpu` suffix. A service may name either image (`spec.runtime.image`,
`spec.fallback.image`); where it names none, the operator runs its own defaults
(`RuntimeImages`: the chart's `runtime.image` and `runtime.cpuImage`, else the images of
the operator's own release).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from fleetserve_operator import __version__

__all__ = [
    "CPU_TRACK_SUFFIX",
    "DEFAULT_CPU_IMAGE",
    "DEFAULT_IMAGE",
    "RUNTIME_REPOSITORY",
    "RUNTIME_VERSION",
    "Image",
    "RuntimeImages",
]

RUNTIME_REPOSITORY = "ghcr.io/fleetserve/fleetserve-runtime"
RUNTIME_VERSION = __version__
"""The runtime release the defaults run: a release tags its images with its packages' version,
so the operator's own."""
CPU_TRACK_SUFFIX = "-cpu"
"""What the CPU-only build adds to the tag of the CUDA build it is built beside."""
DEFAULT_IMAGE = f"{RUNTIME_REPOSITORY}:{RUNTIME_VERSION}"
"""The GPU tracks' image when neither the spec nor the operator's configuration names one."""
DEFAULT_CPU_IMAGE = f"{DEFAULT_IMAGE}{CPU_TRACK_SUFFIX}"
"""The CPU fallback's image when neither the spec nor the operator's configuration names one."""

Image = Annotated[str, Field(min_length=1, max_length=512)]
"""A container image reference, as a pod's `image` takes it."""


@dataclass(frozen=True, slots=True)
class RuntimeImages:
    """The images the operator runs where a spec names none, one per track kind."""

    gpu: str = DEFAULT_IMAGE
    """For the GPU tracks (stable, canary): `spec.runtime.image` when unset."""
    cpu: str = DEFAULT_CPU_IMAGE
    """For the CPU fallback track: `spec.fallback.image` when unset."""
