"""Scheduled runtime pods run as real local processes, as a kubelet would run them."""

from __future__ import annotations

import os
import signal

import httpx

from fleetserve_e2e import KubeClient, LocalCluster, PodAddress
from fleetserve_e2e.kubeapi import namespaced
from fleetserve_e2e.processes import is_pid_alive
from fleetserve_e2e.testing import (
    list_pods,
    runtime_deployment,
    wait_for_deletion,
    wait_for_no_pods,
    wait_for_ready_pods,
)
from fleetserve_e2e.waiting import wait_until

DEPLOYMENTS = "apps/v1"


def _processes_of(cluster: LocalCluster, namespace: str) -> list[PodAddress]:
    return [pod for pod in cluster.pod_addresses() if pod.namespace == namespace]


def _create_deployment(kube: KubeClient, namespace: str, name: str, replicas: int) -> None:
    path = namespaced("deployments", namespace, group_version=DEPLOYMENTS)
    kube.create(path, runtime_deployment(name, replicas=replicas))


def test_deployment_becomes_ready_processes_and_scales_to_zero(
    local_cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    """Deployment → ReplicaSet → 2 pods → 2 processes answering readiness; 0 replicas stops them."""
    _create_deployment(kube, namespace, "demo", replicas=2)
    pods = wait_for_ready_pods(kube, namespace, count=2)
    assert {pod["status"]["podIP"] for pod in pods} == {"127.0.0.1"}
    assert all(pod["spec"]["nodeName"] for pod in pods)

    processes = wait_until(
        lambda: p if len(p := _processes_of(local_cluster, namespace)) == 2 else None,
        timeout_s=10,
        what="2 pod processes in the pod map",
    )
    for process in processes:
        response = httpx.get(f"{process.url}/v2/health/ready", timeout=5, trust_env=False)
        assert response.status_code == 200

    path = namespaced("deployments", namespace, "demo", group_version=DEPLOYMENTS)
    kube.merge_patch(path, {"spec": {"replicas": 0}})
    wait_for_no_pods(kube, namespace)
    wait_until(
        lambda: not any(is_pid_alive(p.pid) for p in processes),
        timeout_s=15,
        what="pod processes to stop",
    )
    # The pod map is rewritten once per sync pass, after the pass has stopped the processes.
    wait_until(
        lambda: _processes_of(local_cluster, namespace) == [],
        timeout_s=10,
        what="the stopped pods to leave the pod map",
    )


def test_exited_process_is_restarted(
    local_cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    """A pod whose process dies goes not-ready, restarts (restartCount 1), and is Ready again."""
    _create_deployment(kube, namespace, "crashy", replicas=1)
    wait_for_ready_pods(kube, namespace, count=1)
    (process,) = wait_until(
        lambda: _processes_of(local_cluster, namespace) or None, timeout_s=10, what="pod process"
    )
    os.kill(process.pid, signal.SIGKILL)

    def restarted_and_ready() -> bool:
        (pod,) = list_pods(kube, namespace)
        status = pod["status"]["containerStatuses"][0]
        return bool(status["restartCount"] == 1 and status["ready"])

    wait_until(restarted_and_ready, timeout_s=60, what="restartCount 1 and Ready")
    (pod,) = list_pods(kube, namespace)
    terminated = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert terminated["exitCode"] == -signal.SIGKILL


def test_gpu_pod_lands_on_gpu_node_and_other_images_just_run(
    kube: KubeClient, namespace: str
) -> None:
    """The scheduler honours GPU capacity and taints; a non-runtime pod is marked Running."""
    pod = {
        "metadata": {"name": "gpu-sidecar"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/busybox:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }
    kube.create(namespaced("pods", namespace), pod)
    (running,) = wait_for_ready_pods(kube, namespace, count=1)
    assert running["spec"]["nodeName"].startswith("gpu-node-")
    assert running["status"]["phase"] == "Running"


def test_deleting_namespace_removes_everything(
    local_cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    """Namespace deletion cascades through Deployment, ReplicaSet and pods to the processes."""
    _create_deployment(kube, namespace, "doomed", replicas=2)
    wait_for_ready_pods(kube, namespace, count=2)
    processes = wait_until(
        lambda: p if len(p := _processes_of(local_cluster, namespace)) == 2 else None,
        timeout_s=10,
        what="2 pod processes",
    )
    kube.delete(f"/api/v1/namespaces/{namespace}")
    wait_for_deletion(kube, f"/api/v1/namespaces/{namespace}", timeout_s=90)
    assert not any(is_pid_alive(p.pid) for p in processes)
    assert _processes_of(local_cluster, namespace) == []
