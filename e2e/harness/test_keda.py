"""KEDA, built from its pinned Go module, scales a Deployment through the real HPA controller.

The cluster runs with ``keda=True``: KEDA's operator and metrics API server as local
processes, its CRDs, and ``v1beta1.external.metrics.k8s.io`` registered with the aggregation
layer of the real kube-apiserver.  A ScaledObject's Prometheus trigger asks a real Prometheus
for ``vector(N)``, a value the test sets by editing the query, so the expected replica count
is exact: ``ceil(N / threshold)`` within ``[minReplicaCount, maxReplicaCount]``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleetserve_e2e import KubeClient, LocalCluster, LocalPrometheus
from fleetserve_e2e.keda import API_SERVICE_PATH, is_available
from fleetserve_e2e.kubeapi import JsonObject, namespaced
from fleetserve_e2e.testing import runtime_deployment, wait_for_ready_pods
from fleetserve_e2e.waiting import wait_until

NAME = "scaled"
KEDA_API = "keda.sh/v1alpha1"
EXTERNAL_API = "external.metrics.k8s.io/v1beta1"
THRESHOLD = 2
SCALE_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def keda_cluster(runtime_commands: dict[str, list[str]]) -> Iterator[LocalCluster]:
    """A cluster of its own running KEDA (the ``keda=True`` option under test)."""
    with LocalCluster(commands=runtime_commands, keda=True, install_gateway_api=False) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def keda_prometheus(keda_cluster: LocalCluster) -> Iterator[LocalPrometheus]:
    """The Prometheus the ScaledObject's trigger queries."""
    with LocalPrometheus(keda_cluster.file_sd_path, scrape_interval_s=1.0) as prometheus:
        yield prometheus


def _scaled_object(prometheus_url: str, value: int) -> JsonObject:
    """1 to 4 replicas of the Deployment, driven by a Prometheus query answering ``value``."""
    no_stabilization = {"stabilizationWindowSeconds": 0}
    return {
        "apiVersion": KEDA_API,
        "kind": "ScaledObject",
        "metadata": {"name": NAME},
        "spec": {
            "scaleTargetRef": {"name": NAME},
            "pollingInterval": 1,
            "minReplicaCount": 1,
            "maxReplicaCount": 4,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleUp": no_stabilization, "scaleDown": no_stabilization}
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": f"vector({value})",
                        "threshold": str(THRESHOLD),
                    },
                }
            ],
        },
    }


def _deployment_replicas(kube: KubeClient, namespace: str) -> int:
    path = namespaced("deployments", namespace, NAME, group_version="apps/v1")
    replicas: int = kube.get(path)["spec"]["replicas"]
    return replicas


def _wait_scaled(kube: KubeClient, namespace: str, replicas: int, since: float) -> float:
    """Wait until the Deployment asks for and has ``replicas`` ready pods.

    Returns the seconds since ``since`` (a monotonic time).
    """
    wait_until(
        lambda: _deployment_replicas(kube, namespace) == replicas,
        timeout_s=SCALE_TIMEOUT_S,
        what=f"the HPA to set {NAME} to {replicas} replicas",
        interval_s=0.5,
    )
    wait_for_ready_pods(kube, namespace, count=replicas, timeout_s=SCALE_TIMEOUT_S)
    return time.monotonic() - since


def test_scaled_object_scales_deployment_up_and_down(
    keda_cluster: LocalCluster, keda_prometheus: LocalPrometheus
) -> None:
    """vector(6) / 2 takes the Deployment from 1 to 3 replicas; vector(0) back to 1.

    Along the way the HPA KEDA created reads the value through the aggregated external
    metrics API of the real API server.
    """
    kube = keda_cluster.client
    assert is_available(kube.get(API_SERVICE_PATH))
    namespace = "keda-scaling"
    kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    kube.create(
        namespaced("deployments", namespace, group_version="apps/v1"),
        runtime_deployment(NAME, replicas=1),
    )
    wait_for_ready_pods(kube, namespace, count=1, timeout_s=SCALE_TIMEOUT_S)
    scaled_objects = namespaced("scaledobjects", namespace, group_version=KEDA_API)
    created = time.monotonic()
    kube.create(scaled_objects, _scaled_object(keda_prometheus.url, 6))

    hpa_path = namespaced(
        "horizontalpodautoscalers", namespace, f"keda-hpa-{NAME}", group_version="autoscaling/v2"
    )
    hpa = wait_until(lambda: kube.get(hpa_path), timeout_s=60, what="KEDA to create the HPA")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    metric = hpa["spec"]["metrics"][0]["external"]
    external = namespaced(metric["metric"]["name"], namespace, group_version=EXTERNAL_API)

    def metric_value() -> Any:
        selector = metric["metric"]["selector"]["matchLabels"]
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())}
        items = kube.get(external, params)["items"]
        return items[0]["value"] if items else None

    assert wait_until(metric_value, timeout_s=60, what="the external metric") == "6"

    up_s = _wait_scaled(kube, namespace, 3, created)
    lowered = time.monotonic()
    kube.merge_patch(
        f"{scaled_objects}/{NAME}",
        {"spec": {"triggers": _scaled_object(keda_prometheus.url, 0)["spec"]["triggers"]}},
    )
    down_s = _wait_scaled(kube, namespace, 1, lowered)
    print(f"keda_scale_up_s={up_s:.1f} keda_scale_down_s={down_s:.1f}")
