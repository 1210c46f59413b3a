"""Fake nodes: Node objects with GPU or CPU-only capacity that no real kubelet backs.

The scheduler places pods on them by their capacity, labels and taints exactly as it would on
real nodes; :mod:`fleetserve_e2e.pod_runner` then plays the kubelet for every pod bound to them.
GPU nodes advertise ``nvidia.com/gpu`` and carry the label and taint the NVIDIA device plugin
and GPU operator set, so GPU pods need the matching toleration, as in production.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from fleetserve_e2e.kubeapi import JsonObject, KubeClient

GPU_RESOURCE = "nvidia.com/gpu"
GPU_LABEL = "nvidia.com/gpu.present"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class NodeSpec:
    """What one fake node offers."""

    name: str
    gpus: int = 0
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110


DEFAULT_NODES = (
    NodeSpec("gpu-node-1", gpus=2),
    NodeSpec("gpu-node-2", gpus=2),
    NodeSpec("cpu-node-1"),
    NodeSpec("cpu-node-2"),
)


def node_manifest(spec: NodeSpec, now: datetime.datetime) -> JsonObject:
    """Return the Node object for ``spec``, status included (a node may set it on create)."""
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods)}
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "fleetserve.io/fake-node": "true",
    }
    taints = []
    if spec.gpus:
        capacity[GPU_RESOURCE] = str(spec.gpus)
        labels[GPU_LABEL] = "true"
        taints.append(GPU_TAINT)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {"taints": taints},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "FakeKubeletReady",
                    "message": "fleetserve e2e harness plays the kubelet for this node",
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fleetserve-e2e",
                "containerRuntimeVersion": "fleetserve-e2e://local-process",
                "kernelVersion": "",
                "osImage": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def register_nodes(client: KubeClient, specs: tuple[NodeSpec, ...] = DEFAULT_NODES) -> None:
    """Create every fake node."""
    now = datetime.datetime.now(datetime.UTC)
    for spec in specs:
        manifest = node_manifest(spec, now)
        client.create("/api/v1/nodes", manifest)
        # Admission (TaintNodesByCondition) adds `node.kubernetes.io/not-ready` on create, and
        # only the node lifecycle controller, disabled here, would lift it once Ready.
        client.merge_patch(f"/api/v1/nodes/{spec.name}", {"spec": manifest["spec"]})
