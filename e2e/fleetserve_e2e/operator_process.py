"""The real operator on a local cluster: the CRD, a least-privilege identity, the process.

The operator e2e tests (``fleetserve_e2e.operator_fixtures``), the rollout e2e tests and the demo
(``fleetserve_demo``) all run ``fleetserve-operator run`` the same way: the checked-in CRD is
installed, the operator authenticates as the ServiceAccount of its shipped RBAC file with a
token from the TokenRequest API (a kubeconfig that holds nothing else), and it runs as a
subprocess watching one namespace.  Running it under that role proves the role suffices.

The InferenceService names are spelled out here (docs/explanation/architecture.md, "Names")
rather than imported from ``fleetserve_operator``: these callers treat the operator as a black
box.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.identity import isolated_env, request_token, write_token_kubeconfig
from fleetserve_e2e.kubeapi import JsonObject, KubeApiError, KubeClient, namespaced
from fleetserve_e2e.paths import REPO_DIR
from fleetserve_e2e.ports import free_ports
from fleetserve_e2e.processes import MARKER_ENV, ManagedProcess, start_process
from fleetserve_e2e.waiting import wait_until

OPERATOR = REPO_DIR / ".venv" / "bin" / "fleetserve-operator"
CRD = REPO_DIR / "crds" / "serving.fleetserve.io_inferenceservices.yaml"
ROLE = REPO_DIR / "operator" / "rbac" / "role.yaml"
CRD_NAME = "inferenceservices.serving.fleetserve.io"
GROUP_VERSION = "serving.fleetserve.io/v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
INSTANCE_LABEL = "app.kubernetes.io/instance"
TRACK_LABEL = "serving.fleetserve.io/track"
MODEL_VERSION_LABEL = "serving.fleetserve.io/model-version"
POOL_LABEL = "serving.fleetserve.io/pool"
MANAGER = "fleetserve-operator"
# Where each kind of child lives in the API (group/version, plural).
CHILD_APIS = {
    "Deployment": ("apps/v1", "deployments"),
    "Service": ("", "services"),
    "HTTPRoute": ("gateway.networking.k8s.io/v1", "httproutes"),
    "GRPCRoute": ("gateway.networking.k8s.io/v1", "grpcroutes"),
}
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"


def fsvc_path(namespace: str, name: str = "") -> str:
    """REST path of the InferenceServices of `namespace` (or of one of them)."""
    return namespaced(PLURAL, namespace, name, group_version=GROUP_VERSION)


def fsvc_status(kube: KubeClient, namespace: str, name: str) -> JsonObject:
    """An InferenceService's status (empty before the operator first writes it)."""
    status: JsonObject = kube.get(fsvc_path(namespace, name)).get("status", {})
    return status


def child_path(kind: str, namespace: str, name: str = "") -> str:
    """REST path of a child kind in `namespace` (or of one object)."""
    group_version, plural = CHILD_APIS[kind]
    return namespaced(plural, namespace, name, group_version=group_version)


def get_or_none(kube: KubeClient, path: str) -> JsonObject | None:
    """GET `path`, or None when it answers 404."""
    try:
        return kube.get(path)
    except KubeApiError as error:
        if error.status_code == 404:
            return None
        raise


def condition(status: Mapping[str, Any], kind: str) -> JsonObject:
    """The condition of type `kind` in `status` (KeyError when absent)."""
    for item in status.get("conditions", []):
        if item["type"] == kind:
            return dict(item)
    raise KeyError(kind)


def install_crd(cluster: LocalCluster) -> None:
    """Apply the checked-in InferenceService CRD and wait until it is Established.

    Raises:
        RuntimeError: kubectl refused the CRD or it was not established within 60 s.
    """
    cluster.apply_crds(CRD, CRD_NAME, timeout_s=60)


NAMESPACE_LOOKUP = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
"""The chart's extra cluster-scoped rule for an operator that watches named namespaces."""


@dataclass(frozen=True)
class OperatorIdentity:
    """The ServiceAccount, ClusterRole and binding of an RBAC file, and a kubeconfig for them.

    `create` renames the role and binding with `suffix` and puts the account in a namespace
    of its own, so several identities (test sessions, a demo) can share one cluster.
    """

    namespace: str
    account: str
    role_name: str
    kubeconfig: Path

    @classmethod
    def create(
        cls,
        cluster: LocalCluster,
        *,
        rbac_file: Path,
        suffix: str,
        kubeconfig: Path,
        token_lifetime_s: int = 3600,
    ) -> OperatorIdentity:
        """Create the RBAC file's objects, request a token and write `kubeconfig` with it.

        `rbac_file` holds a ServiceAccount, a ClusterRole and a ClusterRoleBinding, in that
        order (operator/rbac/role.yaml, or the chart's copy of it).
        """
        kube = cluster.client
        account, role, binding = yaml.safe_load_all(rbac_file.read_text(encoding="utf-8"))
        namespace = f"{account['metadata'].get('namespace', 'fleetserve-system')}-{suffix}"
        name = f"{role['metadata']['name']}-{suffix}"
        account["metadata"]["namespace"] = namespace
        role["metadata"]["name"] = name
        # The harness's operators watch named namespaces (`OperatorProcess.start`), so they get
        # what the chart adds for a namespaced install: kopf looks the watched namespaces up.
        role["rules"] = [*role["rules"], NAMESPACE_LOOKUP]
        binding["metadata"]["name"] = name
        binding["roleRef"]["name"] = name
        binding["subjects"] = [{**binding["subjects"][0], "namespace": namespace}]
        kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
        kube.create(f"{RBAC_API}/clusterroles", role)
        kube.create(f"{RBAC_API}/clusterrolebindings", binding)
        token = request_token(
            kube,
            namespace=namespace,
            account=account["metadata"]["name"],
            expiration_s=token_lifetime_s,
        )
        write_token_kubeconfig(
            kubeconfig, server=cluster.server, ca_cert=cluster.pki.ca_cert, token=token
        )
        return cls(
            namespace=namespace,
            account=account["metadata"]["name"],
            role_name=name,
            kubeconfig=kubeconfig,
        )

    def grant_leader_lease(
        self, kube: KubeClient, namespace: str, lease: str = "fleetserve-operator"
    ) -> None:
        """Let the account hold the leader Lease `lease` in `namespace`, and no other Lease.

        The RBAC file has no Lease rule (a ClusterRole would reach every Lease in the
        cluster); this is the chart's leader-election Role, in the namespace the operator
        elects in. It goes with the namespace.
        """
        name = f"{self.role_name}-leader-election"
        leases = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
        role = {
            "metadata": {"name": name},
            "rules": [
                {**leases, "verbs": ["create"]},
                {**leases, "resourceNames": [lease], "verbs": ["get", "update"]},
            ],
        }
        binding = {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [
                {"kind": "ServiceAccount", "name": self.account, "namespace": self.namespace}
            ],
        }
        kube.create(f"{RBAC_API}/namespaces/{namespace}/roles", role)
        kube.create(f"{RBAC_API}/namespaces/{namespace}/rolebindings", binding)

    def delete(self, kube: KubeClient) -> None:
        """Delete the binding, the role and the account's namespace."""
        kube.delete(f"{RBAC_API}/clusterrolebindings/{self.role_name}")
        kube.delete(f"{RBAC_API}/clusterroles/{self.role_name}")
        kube.delete(f"/api/v1/namespaces/{self.namespace}")


@dataclass
class OperatorProcess:
    """A running `fleetserve-operator run`, its ports and its log."""

    process: ManagedProcess
    metrics_port: int
    liveness_port: int

    @classmethod
    def start(
        cls,
        *,
        kubeconfig: Path,
        namespace: str,
        log_path: Path,
        marker: str,
        settings: Mapping[str, str] | None = None,
        command: Sequence[str] | None = None,
    ) -> OperatorProcess:
        """Start the operator watching `namespace`; returns once it answers /healthz.

        It answers as soon as it runs kopf or waits as a standby for the leader Lease.

        `settings` are extra `FLEETSERVE_*` variables (e.g. a faster rollout timer).
        `command` replaces `fleetserve-operator run`, e.g. with a wrapper that injects a fault.

        Raises:
            ProcessExitedError: the operator exited while starting (the log tail says why).
            TimeoutError: it did not become live within 60 s.
        """
        metrics_port, liveness_port = free_ports(2)
        # Its settings come only from here, and it reaches the API only as `kubeconfig`'s account.
        env = isolated_env(os.environ)
        env.update(
            KUBECONFIG=str(kubeconfig),
            FLEETSERVE_NAMESPACES=json.dumps([namespace]),
            FLEETSERVE_LOG_FORMAT="plain",
            FLEETSERVE_LISTEN_ADDRESS="127.0.0.1",
            FLEETSERVE_METRICS_PORT=str(metrics_port),
            FLEETSERVE_LIVENESS_PORT=str(liveness_port),
            # A temporary error (a PVC not there yet) is retried within a test's time.
            FLEETSERVE_RETRY_DELAY_S="2",
            # The leader Lease in the watched namespace: operators of different tests never
            # wait for one another, those of one test elect one leader.
            FLEETSERVE_LEADER_ELECTION_NAMESPACE=namespace,
            # The harness's cluster-down finds the operator by this marker if a run is killed.
            **{MARKER_ENV: marker},
        )
        env.update(settings or {})
        argv = list(command) if command is not None else [str(OPERATOR), "run"]
        process = start_process("fleetserve-operator", argv, log_path=log_path, env=env)
        running = cls(process=process, metrics_port=metrics_port, liveness_port=liveness_port)
        try:
            wait_until(running.is_live, timeout_s=60.0, what="the operator's /healthz")
        except BaseException:
            running.stop()
            raise
        return running

    @property
    def metrics_url(self) -> str:
        """The operator's own Prometheus metrics endpoint."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def is_live(self) -> bool:
        """Whether kopf answers its liveness probe (raises if the process has exited)."""
        self.process.ensure_running()
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        return httpx.get(url, timeout=2.0, trust_env=False).is_success

    def counters(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """The samples of counter `name` (without `_total`), keyed by their sorted labels."""
        return self._samples(name, f"{name}_total")

    def gauge(self, name: str) -> float:
        """The value of gauge `name`, one without labels."""
        return self._samples(name, name)[()]

    def _samples(
        self, family_name: str, sample_name: str
    ) -> dict[tuple[tuple[str, str], ...], float]:
        text = httpx.get(self.metrics_url, timeout=5.0, trust_env=False).text
        return {
            tuple(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            if family.name == family_name
            for sample in family.samples
            if sample.name == sample_name
        }

    def total(self, name: str) -> float:
        """The sum of counter `name` over all its labels."""
        return sum(self.counters(name).values())

    def log(self) -> str:
        """Everything the operator logged so far."""
        return self.process.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s (kopf stops in about 3 s)."""
        self.process.stop(grace_s=15.0)

    def kill(self) -> None:
        """SIGKILL the operator's process group at once (a crash: no clean-up runs)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.popen.wait(timeout=15.0)
