"""`helm install` of charts/fleetserve on the local control plane: objects created and valid.

The real API server validates every object (the CRD's structural schema, RBAC, the
Deployment); helm waits for the operator Deployment to be Available. Its pod runs no process
here (the image is not `fleetserve-runtime`), so the harness reports it Running and Ready,
KWOK-style; e2e/operator runs the operator itself under the same rules. Each test installs a
release of its own into its namespace and uninstalls it, cluster-scoped RBAC included; the
CRD stays, as Helm leaves CRDs in place.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.paths import binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fleetserve"
ROLE = ROOT / "operator" / "rbac" / "role.yaml"
CRD_NAME = "inferenceservices.serving.fleetserve.io"
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"


def helm(
    cluster: LocalCluster, home: Path, *args: str, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run the built helm against the cluster, with its config and cache kept in `home`."""
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(  # noqa: S603  # the built helm, our own arguments
        [str(binary("helm")), *args],
        env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


@pytest.fixture
def release(
    local_cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """The chart installed as release `fs-<namespace's random suffix>`, values from the param."""
    name = f"fs-{namespace[-5:]}"
    values: list[str] = getattr(request, "param", [])
    installed = helm(
        local_cluster, tmp_path, "install", name, str(CHART), "-n", namespace,
        "--wait", "--timeout", "150s", *values,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert "kubectl get inferenceservices" in installed.stdout, "NOTES.txt did not render"
    yield name
    removed = helm(local_cluster, tmp_path, "uninstall", name, "-n", namespace, "--wait")
    assert removed.returncode == 0, removed.stderr


def shipped_rules() -> list[dict[str, object]]:
    """The rules of operator/rbac/role.yaml's ClusterRole."""
    (role,) = [d for d in yaml.safe_load_all(ROLE.read_text()) if d["kind"] == "ClusterRole"]
    rules: list[dict[str, object]] = role["rules"]
    return rules


def can_i(cluster: LocalCluster, account: str, verb: str, resource: str, namespace: str) -> str:
    """`kubectl auth can-i` as the chart's ServiceAccount: "yes" or "no"."""
    answer = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={account}")
    return answer.stdout.strip()


def test_install_creates_valid_objects(
    local_cluster: LocalCluster, kube: KubeClient, namespace: str, release: str
) -> None:
    """CRD Established, operator Available, RBAC identical to role.yaml and effective."""
    crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    fullname = f"{release}-fleetserve"
    deployment = kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}")
    assert deployment["status"]["availableReplicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == fullname
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{fullname}")
    kube.get(f"/api/v1/namespaces/{namespace}/services/{fullname}-metrics")
    kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{fullname}-dashboard")
    role = kube.get(f"{RBAC_API}/clusterroles/{fullname}")
    assert role["rules"] == shipped_rules()
    account = f"system:serviceaccount:{namespace}:{fullname}"
    assert can_i(local_cluster, account, "patch", "deployments.apps", namespace) == "yes"
    assert can_i(local_cluster, account, "get", "secrets", namespace) == "no"


@pytest.mark.parametrize(
    "release", [pytest.param(["--set", "watchNamespaces={default}"], id="watch-default")],
    indirect=True,
)  # fmt: skip
def test_namespaced_install_grants_only_the_watched_namespace(
    local_cluster: LocalCluster, kube: KubeClient, namespace: str, release: str
) -> None:
    """With watchNamespaces, the rules apply in the watched namespace and nowhere else."""
    fullname = f"{release}-fleetserve"
    account = f"system:serviceaccount:{namespace}:{fullname}"
    kube.get(f"{RBAC_API}/namespaces/default/rolebindings/{fullname}")
    assert can_i(local_cluster, account, "patch", "deployments.apps", "default") == "yes"
    assert can_i(local_cluster, account, "patch", "deployments.apps", namespace) == "no"
    assert can_i(local_cluster, account, "list", "customresourcedefinitions", "default") == "yes"
