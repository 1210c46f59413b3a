"""The operator runs with exactly the RBAC of `operator/rbac/role.yaml`, and nothing more.

Every operator in this folder authenticates with a TokenRequest token of the role's
ServiceAccount (conftest.py), and its teardown fails on any refused request: the scenarios
prove that the role suffices. This test proves the identity is really that narrow one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetserve_e2e import LocalCluster
from fleetserve_e2e.operator_process import NAMESPACE_LOOKUP

ROLE = Path(__file__).resolve().parents[2] / "operator" / "rbac" / "role.yaml"


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        pytest.param("patch", "deployments.apps", "yes", id="apply-deployments"),
        pytest.param("create", "events", "yes", id="post-events"),
        pytest.param("patch", "inferenceservices.serving.fleetserve.io/status", "yes", id="status"),
        pytest.param("create", "pods", "no", id="no-pods"),
        pytest.param("get", "secrets", "no", id="no-secrets"),
        pytest.param("update", "deployments.apps", "no", id="no-update"),
        pytest.param(
            "delete", "inferenceservices.serving.fleetserve.io", "no", id="no-deleting-services"
        ),
    ],
)
def test_operator_identity_has_only_the_role(
    crd: LocalCluster,
    operator_kubeconfig: Path,
    namespace: str,
    verb: str,
    resource: str,
    allowed: str,
) -> None:
    """The token's account may do what the role grants, and is refused the rest."""
    answer = crd.kubectl(
        f"--kubeconfig={operator_kubeconfig}", "auth", "can-i", verb, resource, "-n", namespace
    )
    assert answer.stdout.strip() == allowed, answer.stderr


def test_bound_role_is_the_shipped_one(crd: LocalCluster, operator_kubeconfig: Path) -> None:
    """The ClusterRole the operator runs under has role.yaml's rules, verbatim."""
    _, shipped, _ = yaml.safe_load_all(ROLE.read_text())
    roles = crd.client.get("/apis/rbac.authorization.k8s.io/v1/clusterroles")["items"]
    bound = [
        r for r in roles if r["metadata"]["name"].startswith(f"{shipped['metadata']['name']}-")
    ]
    # Other e2e folders sharing this cluster create their own copies; each must be verbatim,
    # plus the namespace lookup the chart adds for an operator watching named namespaces.
    assert bound
    assert all(r["rules"] == [*shipped["rules"], NAMESPACE_LOOKUP] for r in bound)
