"""Fixtures of the storage initializer's tests: certificates, a loopback HTTPS file server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fleetserve_e2e.pki import ClusterPki, write_pki

from tests.runtime.storage.file_server import FileServer, file_server


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPki:
    """A CA and a serving certificate for 127.0.0.1 (the e2e harness's own PKI)."""
    return write_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def server(pki: ClusterPki) -> Iterator[FileServer]:
    """A running HTTPS file server with no routes yet."""
    with file_server(pki) as running:
        yield running
