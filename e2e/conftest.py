"""Fixtures of the e2e tier: a local cluster, a local Prometheus, one namespace per test.

The harness package is importable because pytest.ini puts this folder on the path
(`pythonpath`); the operator fixtures come from it as a plugin.

Nothing here needs the cluster binaries at import time: they are looked up when the first
fixture starts a cluster, and a missing binary fails that fixture with the command that builds
it (``make tools``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from fleetserve_e2e import KubeApiError, KubeClient, LocalCluster, LocalPrometheus
from fleetserve_e2e.cluster import standin_commands, venv_commands

# The operator fixtures (CRD, least-privilege identity, `start_operator`), for operator_e2e/
# and rollout_e2e/, and the storage servers models are fetched from (S3, an OCI registry,
# HTTPS files), for storage_e2e/ and any test that fetches, and the built images with the
# registry that holds them (images_e2e/, containers_e2e/); plugins, as only the root conftest
# may register one.
pytest_plugins = [
    "fleetserve_e2e.operator_fixtures",
    "fleetserve_e2e.storage_fixtures",
    "fleetserve_e2e.images.fixtures",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--e2e-runtime``: which program runtime pods run."""
    parser.addoption(
        "--e2e-runtime",
        choices=["venv", "standin"],
        default="venv",
        help="venv: the repo's fleetserve-runtime (default); standin: the harness's stand-in",
    )


@pytest.fixture(scope="session")
def runtime_commands(request: pytest.FixtureRequest) -> dict[str, list[str]]:
    """Container command → host argv for runtime pods, as chosen by ``--e2e-runtime``."""
    standin = request.config.getoption("--e2e-runtime") == "standin"
    return standin_commands() if standin else venv_commands()


@pytest.fixture(scope="session")
def local_cluster(runtime_commands: dict[str, list[str]]) -> Iterator[LocalCluster]:
    """A running local cluster shared by the session; torn down at the end, even on failure."""
    with LocalCluster(commands=runtime_commands) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def local_prometheus(local_cluster: LocalCluster) -> Iterator[LocalPrometheus]:
    """A real Prometheus scraping the session cluster's pod processes every second."""
    with LocalPrometheus(local_cluster.file_sd_path, scrape_interval_s=1.0) as prometheus:
        yield prometheus


@pytest.fixture
def kube(local_cluster: LocalCluster) -> KubeClient:
    """The session cluster's admin API client."""
    return local_cluster.client


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: KubeClient) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (its pods stop with it)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{uuid.uuid4().hex[:5]}"
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    try:
        kube.delete(f"/api/v1/namespaces/{name}")
    except KubeApiError as error:
        if error.status_code != 404:  # the test may have deleted it itself
            raise
