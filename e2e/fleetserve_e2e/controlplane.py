"""Command lines of the four real control-plane components, and their start order.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are the unmodified binaries
built by :mod:`fleetserve_e2e.toolchain`; only their flags are chosen here.  Every listener is
on 127.0.0.1 and on a port picked at start, so two clusters can run at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fleetserve_e2e.paths import binary
from fleetserve_e2e.pki import FRONT_PROXY_CLIENT_NAME, ClusterPki
from fleetserve_e2e.ports import PortSet

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The fake kubelet registers nodes once and does not post heartbeats, so the node lifecycle
# controller would mark them NotReady and evict their pods after its grace period.
DISABLED_CONTROLLERS = ("node-lifecycle-controller",)
# The HPA controller's default 15 s loop would make every autoscaling test wait minutes; 3 s
# keeps a scale-up within a few seconds of KEDA's metric crossing the target.
HPA_SYNC_PERIOD = "3s"


@dataclass(frozen=True)
class Ports(PortSet):
    """Loopback ports of one cluster, chosen when it starts."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


def etcd_argv(data_dir: Path, ports: Ports) -> list[str]:
    """Return etcd's command line: one member, data in a temp dir."""
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(binary("etcd")),
        "--name=e2e",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=e2e={peer}",
        # A throwaway test store: durability is not worth an fsync per write on a shared disk.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_argv(work_dir: Path, ports: Ports, pki: ClusterPki) -> list[str]:
    """Return kube-apiserver's command line: TLS with client certificates, Node and RBAC authz."""
    return [
        str(binary("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={work_dir / 'apiserver-certs'}",
        f"--tls-cert-file={pki.server_cert}",
        f"--tls-private-key-file={pki.server_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        # The endpoint reconciler refuses a loopback advertise address; nothing reaches the API
        # server through the in-cluster `kubernetes` Service here anyway.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
        *_aggregation_flags(pki),
    ]


def _aggregation_flags(pki: ClusterPki) -> list[str]:
    """Return the aggregation-layer flags, so aggregated API servers (KEDA's) can be registered.

    Always on, as in every real cluster: it costs one more key pair at start, and clusters with
    and without KEDA then run the same API server.
    """
    return [
        f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT_NAME}",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-username-headers=X-Remote-User",
        f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
        f"--proxy-client-key-file={pki.front_proxy_client_key}",
    ]


def controller_manager_argv(kubeconfig: Path, ports: Ports, pki: ClusterPki) -> list[str]:
    """Return kube-controller-manager's command line (all controllers but node lifecycle)."""
    disabled = ",".join(f"-{name}" for name in DISABLED_CONTROLLERS)
    return [
        str(binary("kube-controller-manager")),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        "--leader-elect=false",
        f"--controllers=*,{disabled}",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
        "--profiling=false",
    ]


def scheduler_argv(kubeconfig: Path, ports: Ports) -> list[str]:
    """Return kube-scheduler's command line."""
    return [
        str(binary("kube-scheduler")),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        "--leader-elect=false",
        "--profiling=false",
    ]
