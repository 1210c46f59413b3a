"""Operator → runtime: `spec.runtime.grpc` renders as the runtime's own `grpc_port`.

Every serving track's rendered flags are parsed with the runtime's real parser, and the
container port the Services target is the port the runtime then listens on.
"""

from __future__ import annotations

from fleetserve_operator.naming import Track
from fleetserve_operator.render import Owner, desired_children, plan_tracks
from fleetserve_operator.render.pods import runtime_args
from fleetserve_operator.spec import InferenceServiceStatus
from fleetserve_operator.testing import make_spec
from fleetserve_runtime.cli import parse_config


def test_every_track_listens_for_grpc_on_the_port_the_spec_names() -> None:
    """Stable and fallback both parse to `grpc_port` 9443, the `grpc` container port."""
    spec = make_spec(runtime={"grpc": {"enabled": True, "port": 9443}}, fallback={"enabled": True})
    parsed = {
        plan.config.track: parse_config(runtime_args(plan)).grpc_port
        for plan in plan_tracks(spec, InferenceServiceStatus())
    }
    assert parsed == {Track.STABLE: 9443, Track.FALLBACK: 9443}
    owner = Owner(name="demo", namespace="ns", uid="uid-demo")
    for child in desired_children(owner, spec, InferenceServiceStatus()):
        if child["kind"] == "Deployment":
            (container,) = child["spec"]["template"]["spec"]["containers"]
            ports = {port["name"]: port["containerPort"] for port in container["ports"]}
            assert ports["grpc"] == 9443


def test_grpc_stays_off_unless_the_spec_enables_it() -> None:
    """A spec that never mentions gRPC, or disables it, starts no gRPC listener."""
    for spec in (make_spec(), make_spec(runtime={"grpc": {"enabled": False, "port": 9001}})):
        for plan in plan_tracks(spec, InferenceServiceStatus()):
            assert parse_config(runtime_args(plan)).grpc_port is None
