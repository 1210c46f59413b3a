"""`spec.runtime.grpc`: the gRPC listener, its ports, and a GRPCRoute that follows the split.

Driven through `Sync` on a `FakeKube`, as the operator runs a rollout: the GRPCRoute's weights
are read back from the stored objects at every step and compared with the HTTPRoute's.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator.records import Manifest
from fleetserve_operator.render import Owner, desired_children
from fleetserve_operator.spec import InferenceServiceStatus
from fleetserve_operator.testing import RollingOut, make_spec

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}], "hostnames": ["oip.example"]}
ON = {"grpc": {"enabled": True}}
OWNER = Owner(name="demo", namespace="ns", uid="uid-demo")


def _spec(version: str, runtime: dict[str, Any], **sections: Any) -> Manifest:
    return {
        "model": {"name": "demo", "version": version, "uri": "builtin://synthetic"},
        "runtime": runtime,
        "rollout": {"steps": [20, 50, 100], "interval": "10s"},
        "traffic": GATEWAY,
        **sections,
    }


def _route(world: RollingOut, kind: str) -> Manifest | None:
    return world.kube.objects.get((kind, "ns", "demo"))


def _weights(route: Manifest | None) -> dict[str, tuple[int, int]]:
    """(weight, port) per backend of a route's only rule; empty when there is no route."""
    if route is None:
        return {}
    (rule,) = route["spec"]["rules"]
    return {ref["name"]: (ref["weight"], ref["port"]) for ref in rule["backendRefs"]}


def _split(world: RollingOut, kind: str) -> dict[str, int]:
    return {name: weight for name, (weight, _) in _weights(_route(world, kind)).items()}


def _service_ports(world: RollingOut, name: str) -> dict[str, Manifest]:
    service = world.kube.objects[("Service", "ns", name)]
    return {port["name"]: port for port in service["spec"]["ports"]}


def _container(world: RollingOut, name: str) -> Manifest:
    deployment = world.kube.objects[("Deployment", "ns", name)]
    container: Manifest
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _serves_grpc(world: RollingOut, name: str) -> bool:
    """The Deployment's pods listen for gRPC, and its Service exposes it."""
    container = _container(world, name)
    flag = "--grpc-port" in container["args"]
    port = any(port["name"] == "grpc" for port in container["ports"])
    exposed = "grpc" in _service_ports(world, name)
    assert flag == port == exposed, (name, flag, port, exposed)
    return flag


def _assert_grpc_follows_http(world: RollingOut) -> None:
    http, grpc = _route(world, "HTTPRoute"), _route(world, "GRPCRoute")
    assert http is not None
    assert grpc is not None
    assert _split(world, "GRPCRoute") == _split(world, "HTTPRoute")
    assert {port for _, port in _weights(grpc).values()} == {9000}
    for field in ("parentRefs", "hostnames"):
        assert grpc["spec"][field] == http["spec"][field]
    (rule,) = grpc["spec"]["rules"]
    assert rule["matches"] == [
        {"method": {"type": "Exact", "service": "inference.GRPCInferenceService"}}
    ]


def test_the_grpc_route_carries_the_http_routes_weights_at_every_step() -> None:
    """20% → 50% → 100% → promoted, then a failover: both routes split alike, to port 9000."""
    world = RollingOut(lambda v: _spec(v, ON, fallback={"enabled": True}), name="demo")
    _assert_grpc_follows_http(world)
    assert _split(world, "GRPCRoute") == {"demo-stable": 80, "demo-canary": 20, "demo-fallback": 0}
    for name in ("demo-stable", "demo-canary", "demo-fallback", "demo"):
        assert _service_ports(world, name)["grpc"] == {
            "name": "grpc",
            "port": 9000,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "kubernetes.io/h2c",
        }
    assert all(_serves_grpc(world, name) for name in ("demo-stable", "demo-canary"))
    assert _serves_grpc(world, "demo-fallback")
    seen = [world.started.canary_weight]
    for _ in range(3):
        seen.append(world.reconcile(after_s=10).canary_weight)
        _assert_grpc_follows_http(world)
    world.kube.set_ready("demo-stable")
    assert world.reconcile().phase == "Succeeded"
    _assert_grpc_follows_http(world)
    assert seen == [20, 50, 100, 100]
    world.kube.set_ready("demo-stable", ready=0)
    world.reconcile()
    _assert_grpc_follows_http(world)
    assert _split(world, "GRPCRoute") == {"demo-stable": 0, "demo-fallback": 100}


def test_turning_grpc_on_is_a_rollout_and_grpc_goes_to_the_canary_only() -> None:
    """Same version, gRPC enabled: a canary runs it; the stable pods keep their args."""
    world = RollingOut(lambda v: _spec("1", ON if v == "2" else {}), name="demo")
    assert world.started.phase == "Progressing"
    assert _serves_grpc(world, "demo-canary")
    assert not _serves_grpc(world, "demo-stable")
    assert "grpc" not in _service_ports(world, "demo")
    # Every gRPC call needs a pod that serves it: only the canary is listed.
    assert _weights(_route(world, "GRPCRoute")) == {"demo-canary": (20, 9000)}
    assert _split(world, "HTTPRoute") == {"demo-stable": 80, "demo-canary": 20}
    for _ in range(3):
        world.reconcile(after_s=10)
    world.kube.set_ready("demo-stable")
    assert world.reconcile().phase == "Succeeded"
    assert _serves_grpc(world, "demo-stable")
    assert "grpc" in _service_ports(world, "demo")
    assert _weights(_route(world, "GRPCRoute")) == {"demo-stable": (100, 9000)}


def test_turning_grpc_off_keeps_it_on_the_stable_track_then_deletes_the_route() -> None:
    """Disabled: the stable track serves gRPC until promotion, then the GRPCRoute goes."""
    world = RollingOut(lambda v: _spec("1", ON if v == "1" else {}), name="demo")
    assert _weights(_route(world, "GRPCRoute")) == {"demo-stable": (80, 9000)}
    assert not _serves_grpc(world, "demo-canary")
    for _ in range(3):
        world.reconcile(after_s=10)
    world.kube.set_ready("demo-stable")
    assert world.reconcile().phase == "Succeeded"
    assert _route(world, "GRPCRoute") is None
    assert ("delete", "GRPCRoute", "demo") in world.kube.writes
    assert not _serves_grpc(world, "demo-stable")


def test_a_service_that_never_asked_for_grpc_renders_as_before() -> None:
    """Off by default: no flag, no port, no GRPCRoute, and the spec hash does not move."""
    plain = make_spec(traffic=GATEWAY)
    explicit = make_spec(traffic=GATEWAY, runtime={"grpc": {"enabled": False}})
    assert explicit.gpu_track.digest == plain.gpu_track.digest
    children = desired_children(OWNER, plain, InferenceServiceStatus())
    assert desired_children(OWNER, explicit, InferenceServiceStatus()) == children
    assert "GRPCRoute" not in {child["kind"] for child in children}
    assert "grpc" not in str(children)
    enabled = make_spec(traffic=GATEWAY, runtime=ON)
    assert enabled.gpu_track.digest != plain.gpu_track.digest


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        pytest.param(
            {"runtime": {"grpc": {"enabled": True, "port": 8080}}},
            "runtime.grpc.port (8080) must differ from 8080, the runtime's HTTP port",
            id="http-port",
        ),
        pytest.param(
            {"runtime": {"grpc": {"enabled": True, "port": 9000}}, "traffic": {"port": 9000}},
            "runtime.grpc.port (9000) must differ from traffic.port (9000)",
            id="service-port",
        ),
        pytest.param(
            {"runtime": ON, "traffic": {**GATEWAY, "hostnames": []}},
            "runtime.grpc with traffic.provider gateway-api needs traffic.hostnames",
            id="gateway-without-hostnames",
        ),
    ],
)
def test_a_grpc_listener_that_cannot_be_reached_is_refused(
    sections: dict[str, Any], message: str
) -> None:
    """Its port collides with neither HTTP port, and a GRPCRoute gets a hostname to match."""
    with pytest.raises(ValidationError) as caught:
        make_spec(**sections)
    assert message in str(caught.value)


def test_a_disabled_listener_takes_no_port() -> None:
    """Off, its port is not checked: nothing listens on it."""
    spec = make_spec(runtime={"grpc": {"enabled": False, "port": 8080}})
    assert not spec.runtime.grpc.enabled
