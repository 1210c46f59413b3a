"""Fixtures of the operator e2e folders: the CRD, a least-privilege identity, operators.

Every test runs the real `fleetserve-operator` as a subprocess under the RBAC that
`operator/rbac/role.yaml` ships (its ServiceAccount, a token from the TokenRequest API, a
kubeconfig holding only that token), so each scenario also proves that the role suffices;
teardown fails a test whose operator was refused anything. `e2e/conftest.py` registers this
module as a pytest plugin, so `operator_e2e/` and `rollout_e2e/` share these fixtures.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.operator_process import (
    CRD,
    ROLE,
    OperatorIdentity,
    OperatorProcess,
    fsvc_path,
    install_crd,
)
from fleetserve_e2e.paths import REPO_DIR
from fleetserve_e2e.testing import assert_operator_log_clean, wait_for_deletion

PYTHON = REPO_DIR / ".venv" / "bin" / "python"


@pytest.fixture(scope="session")
def crd(local_cluster: LocalCluster) -> LocalCluster:
    """The checked-in InferenceService CRD, installed and established."""
    # A CRD older than the models would refuse the operator's status writes with an obscure
    # "field not declared in schema"; say what is wrong instead.
    check = [str(PYTHON), "-m", "fleetserve_operator.crdgen", "--check", str(CRD)]
    fresh = subprocess.run(check, capture_output=True, text=True, timeout=60, check=False)
    assert fresh.returncode == 0, fresh.stderr
    install_crd(local_cluster)
    return local_cluster


@pytest.fixture(scope="session")
def operator_identity(
    crd: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorIdentity]:
    """The operator's ServiceAccount, bound to role.yaml, and a kubeconfig with its token."""
    identity = OperatorIdentity.create(
        crd,
        rbac_file=ROLE,
        suffix=uuid.uuid4().hex[:5],
        kubeconfig=tmp_path_factory.mktemp("operator") / "kubeconfig",
    )
    yield identity
    identity.delete(crd.client)


@pytest.fixture
def operator_kubeconfig(
    crd: LocalCluster, operator_identity: OperatorIdentity, namespace: str
) -> Path:
    """The identity's kubeconfig, allowed the leader Lease in the test's namespace.

    The operators elect there; the chart grants the Lease in the release's namespace.
    """
    operator_identity.grant_leader_lease(crd.client, namespace)
    return operator_identity.kubeconfig


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
        assert_operator_log_clean(running.log(), str(running.process.log_path))


@pytest.fixture
def operator(start_operator: Callable[..., OperatorProcess]) -> OperatorProcess:
    """One operator watching the test's namespace."""
    return start_operator()
