"""The control plane is real: nodes, validation messages, Gateway API CRDs, kubectl."""

from __future__ import annotations

import pytest

from fleetserve_e2e import KubeApiError, KubeClient, LocalCluster
from fleetserve_e2e.kubeapi import namespaced
from fleetserve_e2e.testing import runtime_deployment


def test_kubectl_lists_gpu_and_cpu_nodes(local_cluster: LocalCluster) -> None:
    """The built kubectl reaches the API server through the printed kubeconfig."""
    result = local_cluster.kubectl("get", "nodes", "-o", "name")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "node/cpu-node-1",
        "node/cpu-node-2",
        "node/gpu-node-1",
        "node/gpu-node-2",
    ]
    gpu_node = local_cluster.client.get("/api/v1/nodes/gpu-node-1")
    assert gpu_node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert gpu_node["spec"]["taints"][0]["key"] == "nvidia.com/gpu"


def test_invalid_deployment_is_rejected_with_server_message(
    kube: KubeClient, namespace: str
) -> None:
    """Validation is the API server's own, not a mock's."""
    deployment = runtime_deployment("bad", replicas=-1)
    with pytest.raises(KubeApiError) as raised:
        kube.create(namespaced("deployments", namespace, group_version="apps/v1"), deployment)
    assert raised.value.status_code == 422
    assert "spec.replicas: Invalid value: -1: must be greater than or equal to 0" in (
        raised.value.message
    )


def _httproute(weights: tuple[int, int]) -> dict[str, object]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "demo"},
        "spec": {
            "parentRefs": [{"name": "gateway"}],
            "rules": [
                {
                    "backendRefs": [
                        {"name": "demo-stable", "port": 8080, "weight": weights[0]},
                        {"name": "demo-canary", "port": 8080, "weight": weights[1]},
                    ]
                }
            ],
        },
    }


def test_httproute_with_weights_is_accepted(kube: KubeClient, namespace: str) -> None:
    """The Gateway API CRDs are installed and a weighted HTTPRoute round-trips."""
    path = namespaced("httproutes", namespace, group_version="gateway.networking.k8s.io/v1")
    kube.create(path, _httproute((95, 5)))
    stored = kube.get(f"{path}/demo")
    weights = [ref["weight"] for ref in stored["spec"]["rules"][0]["backendRefs"]]
    assert weights == [95, 5]


def test_httproute_with_negative_weight_is_rejected(kube: KubeClient, namespace: str) -> None:
    """The CRD's OpenAPI schema is enforced by the real API server."""
    path = namespaced("httproutes", namespace, group_version="gateway.networking.k8s.io/v1")
    with pytest.raises(KubeApiError) as raised:
        kube.create(path, _httproute((-1, 5)))
    assert raised.value.status_code == 422
    assert "weight" in raised.value.message
