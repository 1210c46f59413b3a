"""Fixtures of the storage servers models are fetched from: S3, an OCI registry, HTTPS files.

Each server starts once per session, on 127.0.0.1 with TLS, when a test first asks for it,
and stops at the session's end; all three present certificates from one CA
(`storage_ca`), the CA a client under test is given. SeaweedFS and Distribution are built
first when missing (`make storage-tools` builds them ahead). `e2e/conftest.py` registers this
module as a pytest plugin, so any e2e folder can use them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetserve_e2e.file_server import HttpsFileServer
from fleetserve_e2e.object_store import LocalObjectStore, ObjectStore
from fleetserve_e2e.oci_registry import LocalOciRegistry, OciRegistry
from fleetserve_e2e.pki import LocalCa, write_ca


@pytest.fixture(scope="session")
def storage_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCa:
    """The CA that signs every storage server's certificate (``cert`` is the PEM to trust)."""
    return write_ca(tmp_path_factory.mktemp("storage-ca"), "fleetserve-e2e-storage-ca")


@pytest.fixture(scope="session")
def object_store_server(
    storage_ca: LocalCa, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalObjectStore]:
    """The running SeaweedFS (its process and log); tests mostly want `object_store`."""
    with LocalObjectStore(storage_ca, work_dir=tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def object_store(object_store_server: LocalObjectStore) -> ObjectStore:
    """SeaweedFS's S3 server with the bucket ``models`` and its keys (see `ObjectStore`)."""
    return object_store_server.store


@pytest.fixture(scope="session")
def oci_registry_server(
    storage_ca: LocalCa, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalOciRegistry]:
    """The running registry (its process and log); tests mostly want `oci_registry`."""
    with LocalOciRegistry(storage_ca, work_dir=tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture(scope="session")
def oci_registry(oci_registry_server: LocalOciRegistry) -> OciRegistry:
    """Distribution's registry with one htpasswd user (see `OciRegistry`)."""
    return oci_registry_server.registry


@pytest.fixture(scope="session")
def https_file_server(
    storage_ca: LocalCa, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpsFileServer]:
    """The HTTPS file server, serving its ``root`` (a session temp dir tests write into)."""
    base = tmp_path_factory.mktemp("https-files")
    with HttpsFileServer(base / "root", storage_ca, tls_dir=base / "tls") as server:
        yield server


@pytest.fixture
def https_files(https_file_server: HttpsFileServer) -> HttpsFileServer:
    """The session's HTTPS file server with no fault, request or per-file header left over."""
    https_file_server.reset()
    return https_file_server
