"""Fixtures of the gateway e2e tests: a cluster with a pod network, and Traefik in front of it.

The session's cluster is this directory's own (`local_cluster` overrides the e2e one): its
pods get loopback addresses of their own and their Services EndpointSlices that name them
(`LocalCluster(pod_network=True)`), which is what Traefik's Gateway API provider dials.
Traefik runs for the session on 127.0.0.1 with its GatewayClass; each test makes its Gateway.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetserve_e2e import LocalCluster
from fleetserve_e2e.gateway import LocalTraefik, create_gateway_class


@pytest.fixture(scope="session")
def local_cluster(runtime_commands: dict[str, list[str]]) -> Iterator[LocalCluster]:
    """A cluster whose pods each have their own loopback address, torn down at the end."""
    with LocalCluster(commands=runtime_commands, pod_network=True) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def traefik(
    local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTraefik]:
    """Traefik serving the cluster's Gateways of its class (built first if missing)."""
    create_gateway_class(local_cluster.client)
    log_path = tmp_path_factory.mktemp("traefik") / "traefik.log"
    with LocalTraefik(local_cluster, log_path) as running:
        yield running
