"""A real Prometheus discovers and scrapes the pod processes through the file_sd file."""

from __future__ import annotations

from fleetserve_e2e import KubeClient, LocalPrometheus
from fleetserve_e2e.kubeapi import namespaced
from fleetserve_e2e.testing import runtime_deployment, wait_for_ready_pods
from fleetserve_e2e.waiting import wait_until


def test_prometheus_scrapes_both_pods(
    local_prometheus: LocalPrometheus, kube: KubeClient, namespace: str
) -> None:
    """Both replicas show up as healthy targets carrying namespace, pod and track labels."""
    labels = {"serving.fleetserve.io/track": "stable", "serving.fleetserve.io/model-version": "v1"}
    deployment = runtime_deployment("scraped", replicas=2, labels=labels)
    kube.create(namespaced("deployments", namespace, group_version="apps/v1"), deployment)
    pods = wait_for_ready_pods(kube, namespace, count=2)

    def both_up() -> list[dict[str, str]] | None:
        series = local_prometheus.query(f'up{{namespace="{namespace}"}} == 1')
        return [s["metric"] for s in series] if len(series) == 2 else None

    metrics = wait_until(both_up, timeout_s=30, what="2 targets up in Prometheus")
    assert {m["pod"] for m in metrics} == {p["metadata"]["name"] for p in pods}
    assert {m["track"] for m in metrics} == {"stable"}
    assert {m["model_version"] for m in metrics} == {"v1"}
