"""The pod network's EndpointSlices: each Service's ready pods at their own loopback addresses.

With a pod network (``LocalCluster(pod_network=True)``) every process pod has an address of
its own in 127.0.0.0/8 and listens there on its container ports, so a gateway could reach the
pods behind a Service as it would in a cluster.  kube-controller-manager's EndpointSlice
controller cannot say so: kube-apiserver rejects an IPv4 EndpointSlice address in the loopback
range (``may not be in the loopback range (127.0.0.0/8, ::1/128)``), so the controller's slices
of such a Service stay empty.  The fake kubelet therefore publishes one more slice per Service
and port mapping, of address type FQDN, whose addresses are the pods' dotted IPs (valid DNS
subdomains, which the API accepts there); readers that list a Service's slices by its
``kubernetes.io/service-name`` label (Traefik's Kubernetes providers) dial those addresses.

The slices carry what the controller would compute from the same objects: the Service's
selector, each matching pod's Ready condition, and each Service port's ``targetPort`` resolved
against the pod's container ports (by number, or by name).  This module is pure; the runner
writes what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pod_status import LOCAL_IP
from fleetserve_e2e.testing import is_pod_ready

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "pod-network.e2e.fleetserve.io"
"""The managed-by value of the slices this module computes (the controller's differs)."""


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _target_port(pod: JsonObject, target: int | str) -> int | None:
    """The pod's port for a Service port's ``targetPort``: a number, or a container port name."""
    if isinstance(target, int):
        return target
    for container in pod["spec"].get("containers", []):
        for port in container.get("ports", []):
            if port.get("name") == target:
                number: int = port["containerPort"]
                return number
    return None


def _slice_ports(service: JsonObject, pod: JsonObject) -> tuple[tuple[str, int, str], ...]:
    """(name, pod port, protocol) of each Service port the pod has a target for."""
    ports = []
    for port in service["spec"].get("ports", []):
        number = _target_port(pod, port.get("targetPort", port["port"]))
        if number is not None:
            ports.append((port.get("name", ""), number, port.get("protocol", "TCP")))
    return tuple(ports)


def _endpoint(pod: JsonObject) -> JsonObject:
    meta = pod["metadata"]
    ready = is_pod_ready(pod)
    return {
        "addresses": [pod["status"]["podIP"]],
        "conditions": {"ready": ready, "serving": ready, "terminating": False},
        "targetRef": {
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        },
        "nodeName": pod["spec"].get("nodeName", ""),
    }


def _slice(service: JsonObject, index: int, ports: Sequence[tuple[str, int, str]]) -> JsonObject:
    meta = service["metadata"]
    owner = {"apiVersion": "v1", "kind": "Service", "name": meta["name"], "uid": meta["uid"]}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{meta['name']}-pod-network-{index}",
            "namespace": meta["namespace"],
            "labels": {SERVICE_NAME_LABEL: meta["name"], MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
        },
        "addressType": "FQDN",
        "ports": [
            {"name": name, "port": number, "protocol": protocol} for name, number, protocol in ports
        ],
        "endpoints": [],
    }


def endpoint_slices(services: Iterable[JsonObject], pods: Iterable[JsonObject]) -> list[JsonObject]:
    """The pod network's slices of every Service with a selector, sorted by namespace and name.

    Pods at 127.0.0.1 (those the kubelet only reports, or any before the pod network) and pods
    being deleted are left out, as a terminating pod is no endpoint a gateway should pick.
    """
    live = [
        pod
        for pod in pods
        if pod["status"].get("podIP") not in (None, "", LOCAL_IP)
        and not pod["metadata"].get("deletionTimestamp")
    ]
    slices: list[JsonObject] = []
    for service in services:
        selector: dict[str, str] | None = service["spec"].get("selector")
        if not selector or service["spec"].get("type") == "ExternalName":
            continue
        namespace = service["metadata"]["namespace"]
        groups: dict[tuple[tuple[str, int, str], ...], list[Any]] = {}
        for pod in live:
            labels = pod["metadata"].get("labels", {})
            if pod["metadata"]["namespace"] == namespace and _matches(selector, labels):
                groups.setdefault(_slice_ports(service, pod), []).append(_endpoint(pod))
        for index, ports in enumerate(sorted(groups)):
            found = _slice(service, index, ports)
            found["endpoints"] = sorted(groups[ports], key=lambda e: e["targetRef"]["name"])
            slices.append(found)
    return sorted(slices, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"]))
