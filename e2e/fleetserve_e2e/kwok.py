"""KWOK on the local control plane: nodes and pods by the thousand, with no process behind them.

The fake kubelet (``pod_runner``) starts a process per Fleetserve pod, which caps a cluster at
a few dozen replicas. For scale runs (``make bench-operator``) the nodes are KWOK nodes
instead: ``sigs.k8s.io/kwok``'s ``kwok`` controller, built from the separate pinned module in
``e2e/kwok-tools/`` (its own go.mod, so the kube tools' versions never move for it), manages
every Node annotated ``kwok.x-k8s.io/node=fake``, and its default stages (the ones
``kwokctl`` installs: node initialize and heartbeat, pod ready, complete and delete) make each
pod bound to such a node Running and Ready, and finish its deletion. The cluster runs without
the harness's fake kubelet, so nothing else writes pod status.

The binary is built only when a scale run asks for it (``ensure_kwok``) and cached next to
the kube binaries, under ``~/.cache/fleetserve/bin/kwok-<version>/``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.kubeapi import KubeClient
from fleetserve_e2e.nodes import NodeSpec, node_manifest
from fleetserve_e2e.paths import E2E_DIR, cache_dir, pinned_version
from fleetserve_e2e.processes import MARKER_ENV, ManagedProcess, start_process
from fleetserve_e2e.toolchain import module_dir
from fleetserve_e2e.waiting import wait_until

KWOK_TOOLS_DIR = E2E_DIR / "kwok-tools"
KWOK_MODULE = "sigs.k8s.io/kwok"
KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_VALUE = "fake"
# kwokctl's defaults (pkg/kwokctl/runtime/cluster.go), read from the pinned module itself.
DEFAULT_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
# Room for thousands of pod IPs: kwok's default CIDR (a /24) runs out at 254 pods.
POD_CIDR = "10.128.0.1/12"
# The controller manager's default client limits (20 QPS, burst 30) would make creating 2000
# pods take minutes of its own throttling; a real cluster of this size raises them too.
SCALE_CLIENT_FLAGS = ("--kube-api-qps=300", "--kube-api-burst=600")
# Two ClusterIP Services per InferenceService: the harness's default /24 is full at about 120
# services (the API server then refuses every further Service with a 500). A /16; the later
# flag wins over the harness's.
SCALE_SERVICE_CIDR = "--service-cluster-ip-range=10.96.0.0/16"


def kwok_version() -> str:
    """The KWOK version ``e2e/kwok-tools/go.mod`` pins.

    Raises:
        LookupError: go.mod does not require the module.
    """
    return pinned_version(KWOK_MODULE, KWOK_TOOLS_DIR)


def kwok_binary() -> Path:
    """Where the pinned ``kwok`` binary is (or will be) cached."""
    return cache_dir() / "bin" / f"kwok-{kwok_version()}" / "kwok"


def ensure_kwok() -> Path:
    """Return the ``kwok`` binary, building it first when missing (minutes on a cold cache)."""
    target = kwok_binary()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(".kwok.partial")
    print(f"kwok: building {KWOK_PACKAGE}@{kwok_version()} ...", flush=True)
    started = time.monotonic()
    subprocess.run(
        ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(partial), KWOK_PACKAGE],
        cwd=KWOK_TOOLS_DIR,
        env={**os.environ, "CGO_ENABLED": "0"},
        check=True,
    )
    partial.replace(target)  # a half-written binary must never look finished
    print(f"kwok: built in {time.monotonic() - started:.0f}s", flush=True)
    return target


def write_stages(path: Path, source: Path) -> Path:
    """Write kwok's default stages from the module at `source` into one config file."""
    documents = [(source / stage).read_text(encoding="utf-8").strip() for stage in DEFAULT_STAGES]
    path.write_text("\n---\n".join(documents) + "\n", encoding="utf-8")
    return path


def kwok_argv(binary: Path, *, kubeconfig: Path, config: Path) -> list[str]:
    """The ``kwok`` command line: manage the annotated nodes with the default stages."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}={FAKE_NODE_VALUE}",
        f"--cidr={POD_CIDR}",
        "--node-ip=127.0.0.1",
    ]


@dataclass(frozen=True)
class KwokNodes:
    """How many KWOK nodes to register, and what each offers (CPU only)."""

    count: int = 3
    pods_per_node: int = 1000
    cpu: str = "1000"
    memory: str = "4Ti"

    def specs(self) -> tuple[NodeSpec, ...]:
        """One `NodeSpec` per node, named ``kwok-node-<i>``."""
        return tuple(
            NodeSpec(f"kwok-node-{i}", cpu=self.cpu, memory=self.memory, pods=self.pods_per_node)
            for i in range(1, self.count + 1)
        )


def register_kwok_nodes(client: KubeClient, nodes: KwokNodes) -> None:
    """Create the nodes, annotated so that kwok (and only kwok) plays their kubelet."""
    now = datetime.datetime.now(datetime.UTC)
    for spec in nodes.specs():
        manifest = node_manifest(spec, now)
        manifest["metadata"]["annotations"] = {FAKE_NODE_ANNOTATION: FAKE_NODE_VALUE}
        manifest["metadata"]["labels"]["type"] = "kwok"
        client.create("/api/v1/nodes", manifest)
        # As in `nodes.register_nodes`: admission adds the not-ready taint, and the node
        # lifecycle controller that would lift it is off.
        client.merge_patch(f"/api/v1/nodes/{spec.name}", {"spec": manifest["spec"]})


def start_kwok(cluster: LocalCluster, binary: Path) -> ManagedProcess:
    """Start kwok against `cluster` (admin credentials), logging to its work dir."""
    config = write_stages(
        cluster.work_dir / "kwok-stages.yaml", module_dir(KWOK_MODULE, KWOK_TOOLS_DIR)
    )
    return start_process(
        "kwok",
        kwok_argv(binary, kubeconfig=cluster.kubeconfig, config=config),
        log_path=cluster.work_dir / "logs" / "kwok.log",
        env={**os.environ, MARKER_ENV: cluster.marker},
    )


def _nodes_ready(client: KubeClient, process: ManagedProcess, names: set[str]) -> bool:
    process.ensure_running()
    ready = set()
    for node in client.get("/api/v1/nodes")["items"]:
        conditions = node.get("status", {}).get("conditions", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            ready.add(node["metadata"]["name"])
    return names <= ready


@contextlib.contextmanager
def kwok_cluster(
    *,
    nodes: KwokNodes = KwokNodes(),
    work_dir: Path | None = None,
    extra_args: Mapping[str, Sequence[str]] | None = None,
) -> Iterator[LocalCluster]:
    """A `LocalCluster` whose only nodes are KWOK nodes, with kwok running; stopped on exit.

    The controller manager and scheduler get `SCALE_CLIENT_FLAGS`, the API server and the
    controller manager `SCALE_SERVICE_CIDR` (besides `extra_args`).
    """
    binary = ensure_kwok()
    flags: dict[str, list[str]] = {
        "kube-apiserver": [SCALE_SERVICE_CIDR],
        "kube-controller-manager": [*SCALE_CLIENT_FLAGS, SCALE_SERVICE_CIDR],
        "kube-scheduler": [*SCALE_CLIENT_FLAGS],
    }
    for name, args in (extra_args or {}).items():
        flags[name] = [*flags.get(name, []), *args]
    with LocalCluster(
        work_dir=work_dir,
        nodes=(),
        install_gateway_api=False,
        fake_kubelet=False,
        extra_args=flags,
    ) as cluster:
        register_kwok_nodes(cluster.client, nodes)
        kwok = start_kwok(cluster, binary)
        try:
            names = {spec.name for spec in nodes.specs()}
            wait_until(
                lambda: _nodes_ready(cluster.client, kwok, names),
                timeout_s=60.0,
                what="kwok to report its nodes Ready",
            )
            yield cluster
        finally:
            kwok.stop()
