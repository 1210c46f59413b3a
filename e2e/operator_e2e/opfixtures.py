"""Fixtures shared by the operator e2e folders: the CRD, a least-privilege identity, operators.

Every test runs the real `fleetserve-operator` as a subprocess under the RBAC that
`operator/rbac/role.yaml` ships (its ServiceAccount, a token from the TokenRequest API, a
kubeconfig holding only that token), so each scenario also proves that the role suffices;
teardown fails a test whose operator was refused anything. `operator_e2e/conftest.py` and
`rollout_e2e/conftest.py` import these fixtures (with this folder on `sys.path`).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import yaml
from opkit import ROOT, OperatorProcess, fsvc_path

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.testing import wait_for_deletion

PYTHON = ROOT / ".venv" / "bin" / "python"

CRD = ROOT / "crds" / "serving.fleetserve.io_inferenceservices.yaml"
ROLE = ROOT / "operator" / "rbac" / "role.yaml"
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"
TOKEN_LIFETIME_S = 3600


@pytest.fixture(scope="session")
def crd(local_cluster: LocalCluster) -> LocalCluster:
    """The checked-in InferenceService CRD, installed and established."""
    # A CRD older than the models would refuse the operator's status writes with an obscure
    # "field not declared in schema"; say what is wrong instead.
    check = [str(PYTHON), "-m", "fleetserve_operator.crdgen", "--check", str(CRD)]
    fresh = subprocess.run(check, capture_output=True, text=True, timeout=60, check=False)
    assert fresh.returncode == 0, fresh.stderr
    applied = local_cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    assert applied.returncode == 0, applied.stderr
    name = "crd/inferenceservices.serving.fleetserve.io"
    waited = local_cluster.kubectl("wait", "--for=condition=Established", name, "--timeout=60s")
    assert waited.returncode == 0, waited.stderr
    return local_cluster


def _role_documents(suffix: str, namespace: str) -> tuple[JsonObject, JsonObject, JsonObject]:
    """role.yaml's ServiceAccount, ClusterRole and binding, renamed so sessions cannot clash."""
    account, role, binding = yaml.safe_load_all(ROLE.read_text())
    name = f"{role['metadata']['name']}-{suffix}"
    account["metadata"]["namespace"] = namespace
    role["metadata"]["name"] = name
    binding["metadata"]["name"] = name
    binding["roleRef"]["name"] = name
    binding["subjects"] = [{**binding["subjects"][0], "namespace": namespace}]
    return account, role, binding


def _write_token_kubeconfig(path: Path, cluster: LocalCluster, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.pki.ca_cert),
                },
            }
        ],
        "users": [{"name": "fleetserve-operator", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "fleetserve-operator"}}],
        "current-context": "e2e",
    }
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def operator_kubeconfig(
    crd: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A kubeconfig that authenticates as the operator's ServiceAccount, bound to role.yaml."""
    kube = crd.client
    suffix = uuid.uuid4().hex[:5]
    namespace = f"fleetserve-system-{suffix}"
    account, role, binding = _role_documents(suffix, namespace)
    kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
    kube.create(f"{RBAC_API}/clusterroles", role)
    kube.create(f"{RBAC_API}/clusterrolebindings", binding)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_LIFETIME_S},
    }
    account_path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account['metadata']['name']}"
    token = kube.create(f"{account_path}/token", request)["status"]["token"]
    path = tmp_path_factory.mktemp("operator") / "kubeconfig"
    yield _write_token_kubeconfig(path, crd, token)
    kube.delete(f"{RBAC_API}/clusterrolebindings/{binding['metadata']['name']}")
    kube.delete(f"{RBAC_API}/clusterroles/{role['metadata']['name']}")
    kube.delete(f"/api/v1/namespaces/{namespace}")


def _delete_services(kube: KubeClient, namespace: str) -> None:
    """Delete every InferenceService while the operator still runs to release its finalizer."""
    for item in kube.get(fsvc_path(namespace))["items"]:
        path = fsvc_path(namespace, item["metadata"]["name"])
        kube.delete(path)
        wait_for_deletion(kube, path, timeout_s=30.0)


@pytest.fixture
def start_operator(
    crd: LocalCluster,
    operator_kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
) -> Iterator[Callable[..., OperatorProcess]]:
    """Start (another) operator watching the test's namespace as the least-privilege account.

    `start(settings)` adds `FLEETSERVE_*` variables to the operator's environment.

    At teardown the InferenceServices are deleted, every operator stops, and the test fails
    if an operator was refused a request (the role lacks a rule) or raised a traceback.
    """
    started: list[OperatorProcess] = []

    def start(settings: Mapping[str, str] | None = None) -> OperatorProcess:
        running = OperatorProcess.start(
            kubeconfig=operator_kubeconfig,
            namespace=namespace,
            log_path=tmp_path / f"operator-{len(started)}.log",
            marker=crd.marker,
            settings=settings,
        )
        started.append(running)
        return running

    yield start
    try:
        if any(op.process.is_running() for op in started):
            _delete_services(crd.client, namespace)
    finally:
        for running in started:
            running.stop()
    for running in started:
        log = running.log()
        for needle in ("forbidden", "Traceback"):
            assert needle.lower() not in log.lower(), f"operator log has {needle!r}:\n{log[-4000:]}"


@pytest.fixture
def operator(start_operator: Callable[..., OperatorProcess]) -> OperatorProcess:
    """One operator watching the test's namespace."""
    return start_operator()
