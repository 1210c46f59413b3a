"""Promotion survives the operator being killed after any one of its writes.

A promotion spans several reconciles (the last step passes, the stable track rolls to the
new spec while the canary carries all traffic, then the canary goes) and each writes
children and status. `FakeKube.on_write` stops the first operator right after its k-th
write, as SIGKILL would, for every k the promotion makes; a fresh `Sync` (nothing kept,
as after a restart) then drives it to the end. After every single write of both
operators, whatever a gateway or a Service would route to must exist: a backend of a
route with weight must have its Service and a Deployment with replicas behind it, and
a backend of weight 0 its Service. The end is always the same: stable serves version 2
and takes all traffic, and the canary is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fleetserve_operator import naming
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.records import Manifest
from fleetserve_operator.spec import RolloutPhase
from fleetserve_operator.testing import FakeClock, FakeKube, FakeMetricSource, make_service

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}], "hostnames": ["demo.example"]}
INTERVAL_S = 10.0
ROUNDS = 8
"""Reconciles a promotion may take (it needs 3: passed, stable rolled out, settled)."""

SHAPES: dict[str, dict[str, Any]] = {
    # Version 2 stops serving gRPC: the GRPCRoute goes with the stable Service's grpc port.
    "gateway-grpc-turned-off": {
        "traffic": GATEWAY,
        "runtime": {"grpc": {"enabled": True}},
        "2": {"runtime": {"grpc": {"enabled": False}}},
    },
    # Both routes, a fallback backend at 0, and PodDisruptionBudgets (2 replicas a track).
    "gateway-grpc-fallback-pdb": {
        "traffic": GATEWAY,
        "runtime": {"replicas": {"min": 2, "max": 2}, "grpc": {"enabled": True}},
        "fallback": {"enabled": True},
    },
    # An autoscaled stable track: a ScaledObject, and the canary sized from it.
    "gateway-scaledobject": {"traffic": GATEWAY, "scaling": {"maxReplicas": 3, "target": 2}},
    # No route: the umbrella Service spreads requests over the pods (the replica ratio).
    "replica-ratio": {"runtime": {"replicas": {"min": 2, "max": 2}}},
}


class Killed(BaseException):
    """The operator died here: nothing after this write of it ran.

    Not an `Exception`, so no handler of the operator's takes it for an error and goes on.
    """


def _spec(version: str, shape: dict[str, Any]) -> Manifest:
    """The spec of `version`: `shape`'s sections, with those under the key `version` over them."""
    sections = {key: value for key, value in shape.items() if not key.isdigit()}
    return {
        "model": {"name": "demo", "version": version, "uri": "builtin://synthetic"},
        "rollout": {"steps": [50, 100], "interval": f"{INTERVAL_S:g}s"},
        **sections,
        **shape.get(version, {}),
    }


def _operator(kube: FakeKube, clock: FakeClock) -> Sync:
    """A freshly started operator: its own metrics and locks, nothing from an earlier one."""
    return Sync(
        kube,
        metrics=OperatorMetrics(),
        clock=lambda: clock.now,
        default_prometheus_url="http://prometheus:9090",
        metric_source=lambda url: FakeMetricSource(),
    )


def _play_deployment_controller(kube: FakeKube) -> None:
    """Every Deployment rolls out its current template and all its replicas become ready.

    One whose replicas the operator leaves to an autoscaler gets the API server's default.
    """
    for (kind, namespace, name), obj in list(kube.objects.items()):
        if kind == "Deployment":
            obj["spec"].setdefault("replicas", 1)
            kube.set_ready(name, namespace)


def _drive(kube: FakeKube, clock: FakeClock, sync: Sync) -> None:
    """Reconcile an interval apart, the pods following each time, `ROUNDS` times."""
    for _ in range(ROUNDS):
        clock.advance(INTERVAL_S)
        assert sync.run_by_name("ns", "demo", trigger="test") is None
        _play_deployment_controller(kube)


def _deployment_serves(kube: FakeKube, name: str) -> bool:
    deployment = kube.objects.get(("Deployment", "ns", name))
    return deployment is not None and deployment["spec"].get("replicas", 1) > 0


def _missing_backends(kube: FakeKube) -> list[str]:
    """What a route or the umbrella Service sends requests to that is not there.

    A route's backend is a Service port; with weight, a Deployment with replicas as well.
    Status is written ahead of the children, so the canary it gives weight must be there.
    """
    missing = []
    for kind in ("HTTPRoute", "GRPCRoute"):
        route = kube.objects.get((kind, "ns", "demo"))
        rules = route["spec"]["rules"] if route else []
        for ref in [ref for rule in rules for ref in rule["backendRefs"]]:
            name, port = ref["name"], ref["port"]
            service = kube.objects.get(("Service", "ns", name))
            ports = [p["port"] for p in service["spec"]["ports"]] if service else []
            if port not in ports:
                missing.append(f"{kind} backend {name}:{port} (weight {ref['weight']})")
            elif ref["weight"] > 0 and not _deployment_serves(kube, name):
                missing.append(f"{kind} backend {name} at {ref['weight']}% has no Deployment")
    status = kube.status_of("ns", "demo")
    weight = status.canary_weight if status.current_phase.is_rollout_active else 0
    if weight > 0 and not _deployment_serves(kube, "demo-canary"):
        missing.append(f"the canary status gives {weight}%")
    umbrella = kube.objects.get(("Service", "ns", "demo"))
    if umbrella is None:
        return [*missing, "the umbrella Service demo"]
    selector = umbrella["spec"]["selector"]
    selected = [
        name
        for (kind, _, name), obj in kube.objects.items()
        if kind == "Deployment"
        and selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()
        and _deployment_serves(kube, name)
    ]
    return missing if selected else [*missing, f"a Deployment behind Service demo {selector}"]


class Rollout:
    """Version 2 at its last step (100%) of a service in `shape`, its interval about to pass."""

    def __init__(self, shape: dict[str, Any]) -> None:
        self.kube = FakeKube()
        self.kube.add_service(make_service(_spec("1", shape)))
        self.clock = FakeClock()
        sync = _operator(self.kube, self.clock)
        for _ in range(2):
            assert sync.run_by_name("ns", "demo", trigger="test") is None
            _play_deployment_controller(self.kube)
        self.kube.objects[(naming.KIND, "ns", "demo")]["spec"] = _spec("2", shape)
        for _ in range(3):
            self.clock.advance(INTERVAL_S)
            assert sync.run_by_name("ns", "demo", trigger="test") is None
            _play_deployment_controller(self.kube)
        status = self.kube.status_of("ns", "demo")
        assert (status.phase, status.canary_weight) == (RolloutPhase.PROGRESSING, 100)
        self.kube.writes.clear()
        self.states: list[list[str]] = []
        """What was missing after each write, if anything, with the write."""
        self.kube.on_write = self._check

    def _check(self) -> None:
        missing = _missing_backends(self.kube)
        if missing:
            self.states.append([str(self.kube.writes[-1]), *missing])

    def promote(self, *, kill_after: int | None = None) -> None:
        """Run the promotion with one operator, killed after write `kill_after` if given."""
        check: Callable[[], None] = self._check
        if kill_after is not None:

            def check() -> None:
                self._check()
                if len(self.kube.writes) == kill_after:
                    raise Killed

        self.kube.on_write = check
        try:
            _drive(self.kube, self.clock, _operator(self.kube, self.clock))
        except Killed:
            _play_deployment_controller(self.kube)
        finally:
            self.kube.on_write = self._check


def _promotion_writes(shape: dict[str, Any]) -> int:
    rollout = Rollout(shape)
    rollout.promote()
    return len(rollout.kube.writes)


def _crash_points() -> list[Any]:
    return [
        pytest.param(shape, k, id=f"{name}-killed-after-write-{k}")
        for name, shape in SHAPES.items()
        for k in range(1, _promotion_writes(shape) + 1)
    ]


@pytest.mark.parametrize("shape", [pytest.param(s, id=n) for n, s in SHAPES.items()])
def test_promotion_writes_are_the_ones_the_crash_points_cover(shape: dict[str, Any]) -> None:
    """Promotion writes children and status at least twice, and ends promoted."""
    rollout = Rollout(shape)
    rollout.promote()
    kinds = {kind for _, kind, _ in rollout.kube.writes}
    assert {"Deployment", naming.KIND} <= kinds
    assert ("delete", "Deployment", "demo-canary") in rollout.kube.writes
    _assert_promoted(rollout)


@pytest.mark.parametrize(("shape", "kill_after"), _crash_points())
def test_a_restart_after_any_write_of_the_promotion_ends_promoted_and_routed(
    shape: dict[str, Any], kill_after: int
) -> None:
    """Killed after any write, a restarted operator finishes the promotion.

    No backend that takes requests is missing after any write, before or after the kill.
    """
    rollout = Rollout(shape)
    rollout.promote(kill_after=kill_after)
    rollout.promote()
    _assert_promoted(rollout)


def _assert_promoted(rollout: Rollout) -> None:
    kube = rollout.kube
    assert rollout.states == [], "a backend taking requests was missing"
    status = kube.status_of("ns", "demo")
    assert (status.phase, status.stable_version, status.canary_weight) == (
        RolloutPhase.SUCCEEDED,
        "2",
        0,
    )
    assert ("Deployment", "ns", "demo-canary") not in kube.objects
    assert ("Service", "ns", "demo-canary") not in kube.objects
    labels = kube.objects[("Deployment", "ns", "demo-stable")]["spec"]["template"]["metadata"]
    assert labels["labels"][naming.MODEL_VERSION_LABEL] == "2"
    for kind in ("HTTPRoute", "GRPCRoute"):
        route = kube.objects.get((kind, "ns", "demo"))
        if route is None:
            continue
        weights = {ref["name"]: ref["weight"] for ref in route["spec"]["rules"][0]["backendRefs"]}
        assert weights.get("demo-stable") == 100, f"{kind} {weights}"
        assert weights.get("demo-canary", 0) == 0, f"{kind} {weights}"
