"""The harness's pod network: own loopback addresses, and the EndpointSlices that name them."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pod_endpoints import MANAGED_BY, endpoint_slices
from fleetserve_e2e.pod_launch import launch_plan
from fleetserve_e2e.pod_status import Observation, pod_status
from fleetserve_e2e.ports import free_pod_ip
from fleetserve_e2e.testing import runtime_deployment

NOW = "2026-01-01T00:00:00Z"
COMMANDS = {"fleetserve-runtime": ["/venv/bin/fleetserve-runtime"]}


def _pod(name: str, ip: str, *, ready: bool = True, **labels: str) -> JsonObject:
    template = runtime_deployment("demo", replicas=1)["spec"]["template"]
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels}
    status = {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]}
    return {"metadata": meta, "spec": {**template["spec"], "nodeName": "n1"}, "status": status}


def _service(selector: dict[str, str], target: int | str = "http") -> JsonObject:
    return {
        "metadata": {"name": "demo-stable", "namespace": "ns", "uid": "svc-uid"},
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": 80, "targetPort": target, "protocol": "TCP"}],
        },
    }


def test_a_pod_ip_is_a_loopback_address_where_every_port_is_free() -> None:
    offsets = itertools.count(2)
    address = free_pod_ip([8080, 8081], choose=lambda: next(offsets))
    assert address == "127.0.0.2"


def test_a_pod_ip_skips_127_0_0_1_and_the_addresses_of_live_pods() -> None:
    offsets = iter([1, 2, 3])
    assert free_pod_ip([8080], taken={"127.0.0.2"}, choose=lambda: next(offsets)) == "127.0.0.3"


@pytest.fixture
def listener() -> Iterator[tuple[str, int]]:
    """A socket listening on 127.0.0.9 at a port the kernel picked."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.9", 0))
        sock.listen()
        yield "127.0.0.9", int(sock.getsockname()[1])


def test_a_pod_ip_is_not_one_where_a_port_is_taken(listener: tuple[str, int]) -> None:
    _busy, port = listener
    offsets = iter([9, 10])
    assert free_pod_ip([port], choose=lambda: next(offsets)) == "127.0.0.10"


def test_no_pod_ip_after_the_attempts_run_out(listener: tuple[str, int]) -> None:
    _busy, port = listener
    with pytest.raises(OSError, match="no loopback address"):
        free_pod_ip([port], choose=lambda: 9, attempts=3)


def test_a_pod_with_its_own_ip_listens_there_on_its_container_ports() -> None:
    pod = _pod("demo-abc", "")
    container = pod["spec"]["containers"][0]
    asked: list[list[int]] = []

    def allocate(ports: Any) -> str:
        asked.append(list(ports))
        return "127.4.5.6"

    def no_port() -> int:
        raise AssertionError("a pod with its own address needs no remapped port")

    plan = launch_plan(
        pod,
        container,
        commands=COMMANDS,
        base_env={},
        allocate_port=no_port,
        allocate_pod_ip=allocate,
    )
    port = container["ports"][0]["containerPort"]
    assert asked == [[port]]
    assert plan.host == "127.4.5.6"
    assert plan.host_ports == {port: port}
    assert plan.serving_port == port
    assert plan.argv[-4:] == ("--host", "127.4.5.6", "--port", str(port))
    assert plan.readiness is not None
    assert plan.readiness.port == port


def test_the_pod_status_reports_the_pod_ip_on_the_loopback_host() -> None:
    seen = Observation(started_at=NOW, ready_changed_at=NOW, running=True, ready=True)
    pod = _pod("p", "")
    status = pod_status(pod, seen, pod_ip="127.4.5.6")
    assert (status["podIP"], status["podIPs"]) == ("127.4.5.6", [{"ip": "127.4.5.6"}])
    assert status["hostIP"] == "127.0.0.1"
    assert pod_status(pod, seen)["podIP"] == "127.0.0.1"


def test_a_service_slice_lists_its_selected_pods_at_their_ips_and_target_port() -> None:
    pods = [
        _pod("b", "127.0.0.3", track="stable"),
        _pod("a", "127.0.0.2", ready=False, track="stable"),
        _pod("c", "127.0.0.4", track="canary"),
        _pod("kwok", "127.0.0.1", track="stable"),
    ]
    (found,) = endpoint_slices([_service({"track": "stable"})], pods)
    assert found["metadata"]["name"] == "demo-stable-pod-network-0"
    assert found["metadata"]["labels"] == {
        "kubernetes.io/service-name": "demo-stable",
        "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
    }
    assert found["addressType"] == "FQDN"
    port = pods[0]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert found["ports"] == [{"name": "http", "port": port, "protocol": "TCP"}]
    endpoints = [(e["addresses"], e["conditions"]["ready"]) for e in found["endpoints"]]
    assert endpoints == [(["127.0.0.2"], False), (["127.0.0.3"], True)]
    assert found["endpoints"][1]["targetRef"]["name"] == "b"


def test_a_numeric_target_port_is_used_as_it_is() -> None:
    service = _service({"track": "stable"}, target=9000)
    (numeric,) = endpoint_slices([service], [_pod("a", "127.0.0.2", track="stable")])
    assert numeric["ports"][0]["port"] == 9000


def test_services_without_selector_and_terminating_pods_get_no_endpoints() -> None:
    terminating = _pod("a", "127.0.0.2", track="stable")
    terminating["metadata"]["deletionTimestamp"] = NOW
    assert endpoint_slices([_service({})], [_pod("b", "127.0.0.3")]) == []
    assert endpoint_slices([_service({"track": "stable"})], [terminating]) == []
