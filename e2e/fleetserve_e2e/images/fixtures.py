"""Fixtures for the tiers that run the built images: the images and the registry holding them.

``e2e/conftest.py`` registers this module as a pytest plugin, so the images tier and the
containers tier share them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetserve_e2e.images.build import Built, build_images, report
from fleetserve_e2e.images.catalog import OPERATOR, RUNTIME_GPU
from fleetserve_e2e.oci_registry import LocalOciRegistry, OciRegistry
from fleetserve_e2e.paths import cache_dir
from fleetserve_e2e.pki import LocalCa
from fleetserve_e2e.ports import remembered_port


@pytest.fixture(scope="session")
def images() -> dict[str, Built]:
    """The operator and GPU-track runtime images, built (or found built) for this session.

    The CPU track needs torch's CPU wheel, which only PyTorch's own index serves.
    """
    built = build_images((OPERATOR, RUNTIME_GPU))
    print(report(built))
    return {item.spec.name: item for item in built}


@pytest.fixture(scope="session")
def image_registry(storage_ca: LocalCa) -> Iterator[OciRegistry]:
    """Distribution on loopback (TLS, basic auth) whose blobs outlive the session.

    The blobs stay in the cache directory and the port is the last run's when it is free, so
    a run pushes only the layers the last one did not (the runtime's libraries are gigabytes;
    its package a few hundred kilobytes).
    """
    work_dir = cache_dir() / "image-registry"
    port = remembered_port(work_dir / "port")
    with LocalOciRegistry(storage_ca, work_dir=work_dir, port=port) as server:
        yield server.registry
