"""The bake's standby gets no request, by either traffic provider; the flip back is a pointer.

With `gateway-api` the HTTPRoute gives the stable track weight 0; with `replicas` there is
no route, and the umbrella Service would spread requests over every GPU pod, the
standby's too: during the bake it selects the canary's pods alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_operator import naming
from fleetserve_operator.naming import Track
from fleetserve_operator.render import traffic_weights
from fleetserve_operator.spec import (
    Condition,
    ConditionType,
    InferenceServiceStatus,
    RolloutPhase,
)
from fleetserve_operator.testing import make_spec
from tests.operator.render.rendered import children_by_key

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}]}
REPLICAS = {"provider": "replicas"}
GPU_POOL = {
    naming.NAME_LABEL: naming.APP_NAME,
    naming.INSTANCE_LABEL: "demo",
    naming.POOL_LABEL: "gpu",
}


def _status(phase: RolloutPhase, weight: int, **changes: Any) -> InferenceServiceStatus:
    return InferenceServiceStatus(
        phase=phase, stable_version="1", canary_version="2", canary_weight=weight, **changes
    )


def _children(
    status: InferenceServiceStatus, traffic: dict[str, Any], **rollout: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    spec = make_spec(
        model={"name": "demo", "version": "2", "uri": "builtin://synthetic"},
        runtime={"replicas": {"min": 2, "max": 2}},
        traffic=traffic,
        rollout={"bake": "10m", **rollout},
    )
    return children_by_key(spec, status)


def _umbrella(children: dict[tuple[str, str], dict[str, Any]]) -> dict[str, str]:
    selector: dict[str, str] = children[("Service", "demo")]["spec"]["selector"]
    return selector


@pytest.mark.parametrize("traffic", [GATEWAY, REPLICAS], ids=["gateway-api", "replicas"])
def test_the_standby_runs_but_no_service_reaches_it(traffic: dict[str, Any]) -> None:
    """Baking: both Deployments run; the umbrella selects the canary's pods only."""
    children = _children(_status(RolloutPhase.BAKING, 100), traffic)
    assert children[("Deployment", "demo-stable")]["spec"]["replicas"] == 2
    assert children[("Deployment", "demo-canary")]["spec"]["replicas"] == 2
    assert _umbrella(children) == naming.selector("demo", Track.CANARY)
    # The stable track's own Service still selects it: the flip back needs no new endpoints.
    stable = children[("Service", "demo-stable")]["spec"]["selector"]
    assert stable == naming.selector("demo", Track.STABLE)


def test_the_bake_gives_the_standby_weight_0_on_the_route() -> None:
    """gateway-api: stable listed at 0 (so the flip is a weight change), the canary at 100."""
    children = _children(_status(RolloutPhase.BAKING, 100), GATEWAY)
    refs = children[("HTTPRoute", "demo")]["spec"]["rules"][0]["backendRefs"]
    assert {r["name"]: r["weight"] for r in refs} == {"demo-stable": 0, "demo-canary": 100}


@pytest.mark.parametrize("traffic", [GATEWAY, REPLICAS], ids=["gateway-api", "replicas"])
def test_the_flip_back_changes_pointers_not_pods(traffic: dict[str, Any]) -> None:
    """RolledBack after a bake: stable's Deployment is unchanged, the traffic points at it."""
    baking = _children(_status(RolloutPhase.BAKING, 100), traffic)
    flipped = _children(_status(RolloutPhase.ROLLED_BACK, 0), traffic)
    assert flipped[("Deployment", "demo-stable")] == baking[("Deployment", "demo-stable")]
    assert ("Deployment", "demo-canary") not in flipped
    assert _umbrella(flipped) == GPU_POOL
    if traffic is GATEWAY:
        refs = flipped[("HTTPRoute", "demo")]["spec"]["rules"][0]["backendRefs"]
        assert {r["name"]: r["weight"] for r in refs} == {"demo-stable": 100}


def test_the_promotion_after_a_bake_keeps_the_old_pods_out() -> None:
    """Promoting after the bake: the umbrella keeps to the canary while stable's pods roll.

    They still run the old version until they have rolled; then it spreads over the GPU
    pool again.
    """
    assert _umbrella(_children(_status(RolloutPhase.PROMOTING, 100), REPLICAS)) == (
        naming.selector("demo", Track.CANARY)
    )
    assert _umbrella(_children(_status(RolloutPhase.SUCCEEDED, 0), REPLICAS)) == GPU_POOL


def test_without_a_bake_the_umbrella_is_unchanged() -> None:
    """`rollout.bake` unset: promotion spreads over the GPU pool as before."""
    spec = make_spec(traffic=REPLICAS)
    children = children_by_key(spec, _status(RolloutPhase.PROMOTING, 100))
    assert _umbrella(children) == GPU_POOL


def test_a_failover_during_the_bake_goes_to_the_fallback() -> None:
    """The CPU fallback takes precedence over the bake's selector, as over every phase's."""
    active = Condition(
        type=ConditionType.FALLBACK_ACTIVE.value,
        status="True",
        last_transition_time="2026-01-01T00:00:00Z",
        reason="StableUnavailable",
    )
    status = _status(RolloutPhase.BAKING, 100, conditions=[active])
    children = _children(status, REPLICAS)
    assert _umbrella(children)[naming.POOL_LABEL] == "cpu"
    spec = make_spec(traffic=GATEWAY, fallback={"enabled": True}, rollout={"bake": "1m"})
    assert traffic_weights(spec, status) == {
        Track.STABLE: 0,
        Track.CANARY: 0,
        Track.FALLBACK: 100,
    }
