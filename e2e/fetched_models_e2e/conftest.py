"""This folder's session cluster runs runtime pods as containers that can reach the stores.

It replaces the root conftest's `local_cluster`, so the operator fixtures (CRD, identity,
`start_operator`) work on it unchanged: runtime pods are containers of the locally built
runtime image (`make images`), and the names in the storage servers' certificates resolve,
inside every container, to the host's loopback where the servers listen.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from fleetserve_e2e import LocalCluster
from fleetserve_e2e.cluster import local_runtime_images
from fleetserve_e2e.file_server import FILES_SERVER_NAME
from fleetserve_e2e.images.catalog import RUNTIME_GPU, image_tag
from fleetserve_e2e.images.podman import image_exists
from fleetserve_e2e.object_store import S3_SERVER_NAME
from fleetserve_e2e.oci_registry import REGISTRY_SERVER_NAME

STORE_NAMES = (S3_SERVER_NAME, REGISTRY_SERVER_NAME, FILES_SERVER_NAME)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """The session's cluster: runtime pods as containers, the stores reachable by name."""
    local = image_tag(RUNTIME_GPU)
    if shutil.which("podman") is None or not image_exists(local):
        pytest.fail(f"needs podman and {local}: run `make images`", pytrace=False)
    with LocalCluster(
        pod_backend="containers", pod_images=local_runtime_images(), host_names=STORE_NAMES
    ) as cluster:
        yield cluster
