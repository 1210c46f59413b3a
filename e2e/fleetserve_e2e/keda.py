"""Build KEDA from its pinned Go module and run it against a local cluster (``keda=True``).

KEDA's operator (it turns ScaledObjects into HPAs and evaluates triggers) and its metrics API
server (the ``adapter``: it serves ``external.metrics.k8s.io`` to the HPA controller) are the
unmodified upstream commands of ``github.com/kedacore/keda/v2``, built from
``e2e/keda-tools`` (a Go module of its own, so KEDA's few hundred dependencies never move the
Kubernetes pins in ``e2e/tools``) into ``~/.cache/fleetserve/bin/keda-<version>/``.

Here they run as two local processes next to the control plane, not as pods:

- Both use the admin kubeconfig; KEDA's RBAC is not installed (the cluster's own RBAC is what
  the Fleetserve operator is tested against, not KEDA's).
- Their mutual-TLS gRPC link (the adapter asks the operator for metric values) uses one
  certificate directory signed by the cluster CA; KEDA's own certificate rotation is off.
- The aggregation layer reaches the adapter through an ``ExternalName`` Service whose name is
  ``localhost``: kube-apiserver resolves such a Service to ``<externalName>:<APIService
  port>`` (``k8s.io/apiserver/pkg/util/proxy.ResolveCluster``), whereas a ClusterIP would
  need kube-proxy and an EndpointSlice may not hold a loopback address.  The APIService
  carries the cluster CA as its caBundle and the adapter's certificate names the Service, so
  the aggregator verifies TLS as in a real cluster.
- The admission webhooks are not run (they only validate ScaledObjects early).

Every listener is on 127.0.0.1 except the adapter's own Prometheus endpoint, which KEDA binds
on all interfaces (``--port``) with no flag to change it; it is on a free random port.
"""

from __future__ import annotations

import base64
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetserve_e2e.kubeapi import KubeApiError
from fleetserve_e2e.lifecycle import Component
from fleetserve_e2e.paths import E2E_DIR, cache_dir
from fleetserve_e2e.pki import write_mutual_tls_dir
from fleetserve_e2e.ports import PortSet
from fleetserve_e2e.processes import MARKER_ENV, ManagedProcess, start_process
from fleetserve_e2e.toolchain import build_binary, module_dir
from fleetserve_e2e.waiting import wait_until

if TYPE_CHECKING:
    from fleetserve_e2e.cluster import LocalCluster

KEDA_TOOLS_DIR = E2E_DIR / "keda-tools"
KEDA_MODULE = "github.com/kedacore/keda/v2"
# Binary name → Go package; the names are those of KEDA's images' entrypoints.
PACKAGES: dict[str, str] = {
    "keda-operator": f"{KEDA_MODULE}/cmd/operator",
    "keda-adapter": f"{KEDA_MODULE}/cmd/adapter",
}
KEDA_NAMESPACE = "keda"
METRICS_SERVICE = "keda-metrics-apiserver"
EXTERNAL_METRICS_API = "v1beta1.external.metrics.k8s.io"
API_SERVICE_PATH = f"/apis/apiregistration.k8s.io/v1/apiservices/{EXTERNAL_METRICS_API}"
SCALED_OBJECT_CRD = "scaledobjects.keda.sh"
# What a Spawn callback starts a process with: name, argv, extra environment.
Spawn = Callable[[str, list[str], Mapping[str, str]], ManagedProcess]

_REQUIRE_KEDA = re.compile(rf"^require {re.escape(KEDA_MODULE)} (v\S+)$", re.MULTILINE)


def keda_version(go_mod_text: str) -> str:
    """Return the KEDA version a keda-tools go.mod pins.

    Raises:
        LookupError: The go.mod does not require KEDA on a single ``require`` line.
    """
    match = _REQUIRE_KEDA.search(go_mod_text)
    if match is None:
        raise LookupError(f"{KEDA_MODULE} is not pinned in {KEDA_TOOLS_DIR / 'go.mod'}")
    return match.group(1)


def pinned_keda_version() -> str:
    """Return the KEDA version pinned by ``e2e/keda-tools/go.mod``."""
    return keda_version((KEDA_TOOLS_DIR / "go.mod").read_text(encoding="utf-8"))


def keda_bin_dir() -> Path:
    """Return the directory holding the KEDA binaries of the pinned version."""
    return cache_dir() / "bin" / f"keda-{pinned_keda_version()}"


def keda_binary(name: str) -> Path:
    """Return the path of a built KEDA binary, failing with the command that builds it.

    Raises:
        FileNotFoundError: KEDA has not been built yet.
    """
    path = keda_bin_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; build KEDA first with `make keda-tools`")
    return path


def build_keda(target_dir: Path | None = None) -> Path:
    """Build the missing KEDA binaries (stripped, version-stamped) and return their directory."""
    target = target_dir or keda_bin_dir()
    target.mkdir(parents=True, exist_ok=True)
    version = pinned_keda_version()
    # KEDA's Makefile stamps the version its operator logs at start and reports in metrics.
    flags = f"-s -w -X {KEDA_MODULE}/version.Version={version.removeprefix('v')}"
    started = time.monotonic()
    built = 0
    for name, package in PACKAGES.items():
        if (target / name).is_file():
            continue
        print(f"keda: building {name} from {package}@{version} ...", flush=True)
        step = time.monotonic()
        build_binary(name, package, target, module=KEDA_TOOLS_DIR, flags=flags)
        print(f"keda: {name} built in {time.monotonic() - step:.0f}s", flush=True)
        built += 1
    print(
        f"keda: {built} built, {len(PACKAGES) - built} present, in {target} "
        f"({time.monotonic() - started:.0f}s)",
        flush=True,
    )
    return target


def keda_crd_dir() -> Path:
    """Return the directory of KEDA's CRD manifests in the pinned module."""
    return module_dir(KEDA_MODULE, KEDA_TOOLS_DIR) / "config" / "crd" / "bases"


@dataclass(frozen=True)
class KedaPorts(PortSet):
    """Loopback ports of one KEDA installation, chosen when it starts."""

    operator_metrics: int
    operator_health: int
    operator_grpc: int
    adapter_secure: int
    adapter_metrics: int


def keda_env(kubeconfig: Path) -> dict[str, str]:
    """Return the environment both KEDA processes need (what KEDA's manifests set)."""
    return {
        "KUBECONFIG": str(kubeconfig),
        "WATCH_NAMESPACE": "",
        "POD_NAMESPACE": KEDA_NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
    }


def operator_argv(cert_dir: Path, ports: KedaPorts) -> list[str]:
    """Return the KEDA operator's command line: no leader election, no cert rotation."""
    return [
        str(keda_binary("keda-operator")),
        f"--metrics-bind-address=127.0.0.1:{ports.operator_metrics}",
        f"--health-probe-bind-address=127.0.0.1:{ports.operator_health}",
        f"--metrics-service-bind-address=127.0.0.1:{ports.operator_grpc}",
        f"--cert-dir={cert_dir}",
        f"--ca-dir={cert_dir}",
        "--leader-elect=false",
        "--enable-cert-rotation=false",
        "--enable-webhook-patching=false",
        "--enable-apiservice-patching=false",
        "--zap-log-level=info",
    ]


def adapter_argv(cert_dir: Path, kubeconfig: Path, ports: KedaPorts) -> list[str]:
    """Return the KEDA metrics API server's command line, serving TLS on 127.0.0.1."""
    return [
        str(keda_binary("keda-adapter")),
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.adapter_secure}",
        f"--port={ports.adapter_metrics}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={cert_dir / 'tls.crt'}",
        f"--tls-private-key-file={cert_dir / 'tls.key'}",
        f"--client-ca-file={cert_dir / 'ca.crt'}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--metrics-service-address=127.0.0.1:{ports.operator_grpc}",
        "--zap-log-level=info",
    ]


def metrics_api_manifests(ca_pem: bytes, port: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the Service and APIService that register the adapter with the aggregator."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": METRICS_SERVICE, "namespace": KEDA_NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost"},
    }
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": EXTERNAL_METRICS_API},
        "spec": {
            "service": {"name": METRICS_SERVICE, "namespace": KEDA_NAMESPACE, "port": port},
            "group": "external.metrics.k8s.io",
            "version": "v1beta1",
            "caBundle": base64.b64encode(ca_pem).decode("ascii"),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    return service, api_service


def is_available(api_service: Mapping[str, Any]) -> bool:
    """Return whether an APIService reports ``Available=True``."""
    conditions = api_service.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


def start_keda(cluster: LocalCluster, spawn: Spawn, *, timeout_s: float) -> None:
    """Install KEDA's CRDs, start its operator and adapter, and register the metrics API.

    Returns once the aggregator reports the external metrics API available, so an HPA that
    KEDA creates gets metrics from its first sync.
    """
    client = cluster.client
    _create_if_absent(client.create, "/api/v1/namespaces", {"metadata": {"name": KEDA_NAMESPACE}})
    cluster.apply_crds(keda_crd_dir(), SCALED_OBJECT_CRD, timeout_s=int(timeout_s))
    cert_dir = write_mutual_tls_dir(
        cluster.pki, cluster.work_dir / "keda-certs", f"{METRICS_SERVICE}.{KEDA_NAMESPACE}.svc"
    )
    ports = KedaPorts.pick()
    env = keda_env(cluster.kubeconfig)
    operator = spawn("keda-operator", operator_argv(cert_dir, ports), env)
    wait_until(
        lambda: operator.answers(f"http://127.0.0.1:{ports.operator_health}/readyz"),
        timeout_s=timeout_s,
        what=f"the KEDA operator's /readyz (log: {operator.log_path})",
        interval_s=0.2,
    )
    adapter = spawn("keda-adapter", adapter_argv(cert_dir, cluster.kubeconfig, ports), env)
    service, api_service = metrics_api_manifests(
        (cert_dir / "ca.crt").read_bytes(), ports.adapter_secure
    )
    _create_if_absent(client.create, f"/api/v1/namespaces/{KEDA_NAMESPACE}/services", service)
    _create_if_absent(client.create, "/apis/apiregistration.k8s.io/v1/apiservices", api_service)

    def available() -> bool:
        adapter.ensure_running()
        operator.ensure_running()
        return is_available(client.get(API_SERVICE_PATH))

    wait_until(
        available,
        timeout_s=timeout_s,
        what=f"APIService {EXTERNAL_METRICS_API} Available (log: {adapter.log_path})",
        interval_s=0.3,
    )


class LocalKeda(Component):
    """Context manager running KEDA against an already running :class:`LocalCluster`.

    Tests use it to add KEDA to a shared session cluster for as long as they need it; on exit
    it stops both processes and removes the APIService, because an aggregated API that no
    longer answers makes API discovery report errors to every other client of the cluster.
    """

    def __init__(self, cluster: LocalCluster, *, timeout_s: float = 60.0) -> None:
        """Remember the cluster; nothing starts before ``__enter__``."""
        self._cluster = cluster
        self._timeout_s = timeout_s
        self._processes: list[ManagedProcess] = []

    def _start(self) -> None:
        """Start KEDA and wait until the external metrics API is available."""
        start_keda(self._cluster, self._spawn, timeout_s=self._timeout_s)

    def close(self) -> None:
        """Unregister the metrics API, then stop the adapter and the operator."""
        try:
            self._cluster.client.delete(API_SERVICE_PATH)
        except KubeApiError as error:
            if error.status_code != 404:
                raise
        finally:
            for process in reversed(self._processes):
                process.stop()
            self._processes.clear()

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> ManagedProcess:
        process = start_process(
            name,
            argv,
            log_path=self._cluster.work_dir / "logs" / f"{name}.log",
            env={**os.environ, **env, MARKER_ENV: self._cluster.marker},
        )
        self._processes.append(process)
        return process


def _create_if_absent(
    create: Callable[[str, Mapping[str, Any]], object], path: str, body: Mapping[str, Any]
) -> None:
    try:
        create(path, body)
    except KubeApiError as error:
        if error.status_code != 409:
            raise
