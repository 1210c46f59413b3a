"""``LocalCluster``: a real control plane on 127.0.0.1 with fake nodes that run real pods.

Start order: etcd → kube-apiserver (wait for /readyz) → admin kubeconfig → fake nodes →
kube-controller-manager and kube-scheduler → Gateway API CRDs → the fake kubelet.  Teardown runs
in reverse, stops every process it started by process group, and removes the temp dir, also
when start-up or the test failed.  Used by ``e2e/conftest.py`` and by ``make cluster-up``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from fleetserve_e2e import controlplane
from fleetserve_e2e.container_pod import remove_cluster_containers
from fleetserve_e2e.images.catalog import RUNTIME_GPU, image_tag
from fleetserve_e2e.images.registry import PullOptions
from fleetserve_e2e.keda import start_keda
from fleetserve_e2e.kubeapi import KubeClient
from fleetserve_e2e.kubeconfig import write_kubeconfig
from fleetserve_e2e.lifecycle import Component
from fleetserve_e2e.nodes import DEFAULT_NODES, NodeSpec, register_nodes
from fleetserve_e2e.paths import REPO_DIR, binary
from fleetserve_e2e.pki import ClusterPki, write_pki
from fleetserve_e2e.pod_containers import node_directory
from fleetserve_e2e.pod_map import FILE_SD_FILE, POD_MAP_FILE, PodAddress, read_pod_map
from fleetserve_e2e.pod_runner import Backend, PodRunner, RunnerConfig
from fleetserve_e2e.processes import MARKER_ENV, ManagedProcess, start_process
from fleetserve_e2e.testing import RUNTIME_IMAGE
from fleetserve_e2e.toolchain import gateway_api_crd_dir
from fleetserve_e2e.waiting import GiveUpError, wait_until

STANDIN_RUNTIME = Path(__file__).with_name("standin_runtime.py")
_GATEWAY_CRD = "httproutes.gateway.networking.k8s.io"


def venv_commands(venv: Path = REPO_DIR / ".venv") -> dict[str, list[str]]:
    """Container commands resolved in the repo's virtualenv, which stands in for the image."""
    bin_dir = venv / "bin"
    names = ("fleetserve-runtime", "fleetserve-operator", "python", "python3")
    return {name: [str(bin_dir / name)] for name in names}


def local_runtime_images() -> dict[str, str]:
    """The runtime image tests (and the operator, by default) name → the one built here."""
    return {RUNTIME_IMAGE: image_tag(RUNTIME_GPU)}


def standin_commands() -> dict[str, list[str]]:
    """Runtime pods served by the stdlib stand-in runtime (harness self-tests).

    The operator has no stand-in; it is light and runs from the virtualenv.
    """
    return {
        "fleetserve-runtime": [sys.executable, str(STANDIN_RUNTIME)],
        "fleetserve-operator": venv_commands()["fleetserve-operator"],
    }


class LocalCluster(Component):
    """Context manager for one local cluster; several may run at once.

    Args:
        work_dir: Where certificates, etcd data, logs, kubeconfig and pod maps go; a temp dir
            that is removed on exit when None.
        nodes: The fake nodes to register.
        commands: Container command name → host argv; defaults to :func:`venv_commands`.
        install_gateway_api: Whether to install the Gateway API standard CRDs.
        start_timeout_s: Deadline for each start-up step, in seconds.
        fake_kubelet: Whether the harness plays the kubelet (``pod_runner``); off when another
            kubelet stand-in (KWOK, ``fleetserve_e2e.kwok``) owns every pod's status.
        extra_args: Component name (``kube-apiserver``, ``kube-controller-manager``, ...) →
            flags appended to its command line (an audit log, higher client QPS for scale).
        keda: Whether to run KEDA's operator and metrics API server (``fleetserve_e2e.keda``),
            so ScaledObjects drive real HPAs; needs ``make keda-tools``.
        pod_backend: How the fake kubelet runs runtime and operator pods: ``processes``
            (local processes from `commands`) or ``containers`` (podman containers of the
            pod's image; needs ``make images``).
        pod_images: Image reference in pod specs → local tag to run (``containers`` only).
        pull: How a ``containers`` pod's image missing locally is pulled (registry CA
            directory, credentials).
        host_names: Names that resolve to the host's loopback inside every ``containers``
            pod, so that a pod reaches a server a test runs on 127.0.0.1 (an object store, a
            registry) by the name in its certificate, as a cluster's DNS would resolve it.
        pod_network: Whether each process pod gets a loopback address of its own as its
            podIP, listening there on its container ports, so that Services' EndpointSlices
            reach it (a gateway in front of the pods needs this); off, pods share 127.0.0.1
            at remapped ports that only the pod map tells apart.
    """

    def __init__(
        self,
        *,
        work_dir: Path | None = None,
        nodes: Sequence[NodeSpec] = DEFAULT_NODES,
        commands: Mapping[str, Sequence[str]] | None = None,
        install_gateway_api: bool = True,
        start_timeout_s: float = 60.0,
        fake_kubelet: bool = True,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        keda: bool = False,
        pod_backend: Backend = "processes",
        pod_images: Mapping[str, str] | None = None,
        pull: PullOptions | None = None,
        host_names: Sequence[str] = (),
        pod_network: bool = False,
    ) -> None:
        """Configure the cluster; nothing starts before ``__enter__``."""
        self._requested_dir = work_dir
        self._nodes = tuple(nodes)
        self._commands = dict(commands) if commands is not None else venv_commands()
        self._install_gateway_api = install_gateway_api
        self._timeout_s = start_timeout_s
        self._fake_kubelet = fake_kubelet
        self._extra_args = {name: list(args) for name, args in (extra_args or {}).items()}
        self._keda = keda
        self._pod_backend: Backend = pod_backend
        self._pod_images = dict(pod_images or {})
        self._pull = pull or PullOptions()
        self._host_names = tuple(host_names)
        self._pod_network = pod_network
        self.work_dir = Path()
        self.ports = controlplane.Ports.pick()
        self._processes: list[ManagedProcess] = []
        self._client: KubeClient | None = None
        self._runner: PodRunner | None = None

    # -- public surface ---------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server URL."""
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def kubeconfig(self) -> Path:
        """Path of the admin kubeconfig."""
        return self.work_dir / "kubeconfig"

    @property
    def pki(self) -> ClusterPki:
        """Certificate and key files of this cluster."""
        return ClusterPki.in_directory(self.work_dir / "pki")

    @property
    def client(self) -> KubeClient:
        """An admin API client (valid while the cluster runs)."""
        if self._client is None:
            raise RuntimeError("the cluster is not running")
        return self._client

    @property
    def pod_map_path(self) -> Path:
        """The JSON file mapping each running pod process to its address."""
        return self.work_dir / POD_MAP_FILE

    @property
    def file_sd_path(self) -> Path:
        """The Prometheus file_sd file listing the pod processes."""
        return self.work_dir / FILE_SD_FILE

    @property
    def marker(self) -> str:
        """Value of ``E2E_HARNESS_CLUSTER`` in the environment of every process started."""
        return str(self.work_dir)

    def node_dir(self, node: str) -> Path:
        """The simulated node's own directory tree, where its pods' hostPath volumes live.

        ``containers`` backend only; a test prepares a node's directories in it.
        """
        return node_directory(self.work_dir, node)

    def pod_addresses(self) -> list[PodAddress]:
        """Return the running pod processes and their addresses."""
        return read_pod_map(self.pod_map_path)

    def pids(self) -> list[int]:
        """Return the pids of all processes this cluster is running (control plane and pods)."""
        own = [p.pid for p in self._processes if p.is_running()]
        return own + (self._runner.pids() if self._runner is not None else [])

    def kubectl(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster and return its result (not checked)."""
        return subprocess.run(
            [str(binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def apply_crds(self, path: Path, established: str, *, timeout_s: int) -> None:
        """Server-side apply the CRD file or directory `path`; wait until `established` is.

        Raises:
            RuntimeError: kubectl refused the CRDs.
            GiveUpError: kubectl gave up waiting for `established` (a CRD name).
            TimeoutError: `established` was not Established within `timeout_s`.
        """
        applied = self.kubectl("apply", "--server-side", "-f", str(path))
        if applied.returncode != 0:
            raise RuntimeError(f"applying {path.name} failed:\n{applied.stderr}")

        def is_established() -> bool:
            waited = self.kubectl(
                "wait",
                "--for=condition=Established",
                f"crd/{established}",
                f"--timeout={timeout_s}s",
            )
            if waited.returncode == 0:
                return True
            # A CRD just created has no status yet, and `kubectl wait` then fails at once on
            # the missing conditions instead of waiting: ask again.
            if "accessor error" in waited.stderr:
                return False
            raise GiveUpError(f"{established} was not established:\n{waited.stderr}")

        wait_until(is_established, timeout_s=timeout_s, what=f"CRD {established}", interval_s=0.2)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the pod runner, then every process in reverse start order; remove the temp dir."""
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
        if self._pod_backend == "containers":
            remove_cluster_containers(self.marker)
        if self._client is not None:
            self._client.close()
            self._client = None
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()
        if self._requested_dir is None and self.work_dir != Path():
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # -- start-up steps ---------------------------------------------------------------------

    def _start(self) -> None:
        """Start everything and wait until the cluster can run pods."""
        started = time.monotonic()
        if self._requested_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="fleetserve-cluster-"))
        else:
            self.work_dir = self._requested_dir
            self.work_dir.mkdir(parents=True, exist_ok=True)
        pki = write_pki(self.work_dir / "pki")
        etcd = self._spawn("etcd", controlplane.etcd_argv(self.work_dir / "etcd", self.ports))
        self._wait(lambda: _etcd_healthy(etcd, self.ports.etcd_client), "etcd /health")
        apiserver = self._spawn(
            "kube-apiserver", controlplane.apiserver_argv(self.work_dir, self.ports, pki)
        )
        self._client = KubeClient(self.server, pki)
        client = self._client
        self._wait(lambda: _apiserver_ready(apiserver, client), "kube-apiserver /readyz")
        write_kubeconfig(self.kubeconfig, server=self.server, pki=pki)
        register_nodes(client, self._nodes)
        self._spawn(
            "kube-controller-manager",
            controlplane.controller_manager_argv(self.kubeconfig, self.ports, pki),
        )
        self._spawn("kube-scheduler", controlplane.scheduler_argv(self.kubeconfig, self.ports))
        if self._install_gateway_api:
            self.apply_crds(gateway_api_crd_dir(), _GATEWAY_CRD, timeout_s=30)
        # The service-account controller creating "default" proves the controller manager works,
        # and pods cannot be admitted in a namespace before it exists.
        self._wait(
            lambda: client.get("/api/v1/namespaces/default/serviceaccounts/default"),
            "the default service account",
        )
        if self._fake_kubelet:
            self._runner = PodRunner(client, self._runner_config())
            self._runner.start()
        if self._keda:
            start_keda(self, self._spawn, timeout_s=self._timeout_s)
        print(f"cluster ready in {time.monotonic() - started:.1f}s", flush=True)
        print(f"KUBECONFIG={self.kubeconfig}", flush=True)

    def _runner_config(self) -> RunnerConfig:
        return RunnerConfig(
            work_dir=self.work_dir,
            commands=self._commands,
            base_env={**os.environ, MARKER_ENV: self.marker},
            server=self.server,
            ca_cert=self.pki.ca_cert,
            backend=self._pod_backend,
            images=self._pod_images,
            pull=self._pull,
            marker=self.marker,
            host_names=self._host_names,
            pod_network=self._pod_network,
        )

    def _spawn(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        process = start_process(
            name,
            [*argv, *self._extra_args.get(name, ())],
            log_path=self.work_dir / "logs" / f"{name}.log",
            env={**os.environ, **(env or {}), MARKER_ENV: self.marker},
        )
        self._processes.append(process)
        return process

    def _wait(self, condition: Callable[[], object], what: str) -> None:
        wait_until(condition, timeout_s=self._timeout_s, what=what)


def _etcd_healthy(etcd: ManagedProcess, port: int) -> bool:
    etcd.ensure_running()
    response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0, trust_env=False)
    return bool(response.is_success and response.json().get("health") == "true")


def _apiserver_ready(apiserver: ManagedProcess, client: KubeClient) -> bool:
    apiserver.ensure_running()
    return client.get_text("/readyz") == "ok"
