"""Helpers of the rollout e2e tests: a canary rollout of one synthetic InferenceService.

The service has one synthetic replica per track, gateway-api traffic and `STEPS` of 4 s
analysed on a 4 s window of the test's Prometheus; `deploy` waits for version 1 to serve,
`roll_out` starts version 2, and the rest read back what the operator wrote: status, Events
and the HTTPRoute's weights. They act in a `RolloutEnv`, the one fixture a rollout test takes
(`rollout_e2e/conftest.py` builds it). The tests of `rollout_e2e/` share them. Every wait has
a deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.kubeapi import JsonObject, KubeClient
from fleetserve_e2e.loadgen import LoadDriver, track_weights
from fleetserve_e2e.operator_process import OperatorProcess, child_path, fsvc_path, fsvc_status
from fleetserve_e2e.operator_testing import service_events, synthetic_service, wait_for_events
from fleetserve_e2e.prometheus import LocalPrometheus
from fleetserve_e2e.waiting import wait_until

NAME = "demo"
BASE_LATENCY_MS = 20
STEPS = [20, 50, 100]
INTERVAL_S = 4.0
ROLLOUT_S = 120.0
ROLLOUT_SETTINGS = {
    # Steps fall due by the clock: tick well inside the tests' 4 s intervals.
    "FLEETSERVE_ROLLOUT_TICK_S": "0.5",
}
"""The operator settings of every rollout e2e test: a fast rollout timer."""
THRESHOLD_ONLY = {
    # Tail latencies of 1-replica tracks on two busy cores are noisy: 2x, not 1.5x.
    "maxLatencyRatioVsStable": 2.0,
    "maxQueueWaitRatioVsStable": 10.0,
}
SEQUENTIAL_ONLY = {
    # These tests judge other things than power: ruling out a regression to 10x stable's odds
    # (of at least 1%) takes about 50 canary requests, so the 50% step is not held for long.
    # test_canary_power.py rolls out at the default, 2.
    "minDetectableRatio": 10.0,
}


@dataclass(frozen=True)
class RolloutEnv:
    """What a rollout test works with: the cluster's API, its namespace, Prometheus, operators.

    `start_operator()` starts (another) operator with the fast rollout timer; the fixture that
    built the env stops them all at teardown.
    """

    kube: KubeClient
    namespace: str
    prometheus: LocalPrometheus
    cluster: LocalCluster
    start_operator: Callable[[], OperatorProcess]


def synthetic_model(version: str, **params: float) -> dict[str, str]:
    """The synthetic model at `BASE_LATENCY_MS`; `params` add to its URI's query."""
    query = "&".join(f"{k}={v}" for k, v in {"latency_ms": BASE_LATENCY_MS, **params}.items())
    return {"name": NAME, "version": version, "uri": f"builtin://synthetic?{query}"}


def rollout_service(
    prometheus: LocalPrometheus,
    mode: str = "threshold",
    model: dict[str, str] | None = None,
    interval_s: float = INTERVAL_S,
    *,
    analysis: JsonObject | None = None,
    progress_deadline: str = "2m",
    rollout: JsonObject | None = None,
    **sections: Any,
) -> JsonObject:
    """One synthetic replica, gateway-api traffic, 4 s steps analysed on 4 s of metrics.

    `analysis` overrides the analysis settings (each mode gets only the fields it uses);
    `rollout` adds to the rollout section (a `bake`, a `shadow` stage).
    """
    settings = {
        "mode": mode,
        "prometheusUrl": prometheus.url,
        "window": "4s",
        "minRequests": 5,
        "failureThreshold": 1,
        # A generative canary's 5 streams of 16 tokens.
        "minTokens": 50,
        **(THRESHOLD_ONLY if mode == "threshold" else SEQUENTIAL_ONLY),
        **(analysis or {}),
    }
    return synthetic_service(
        NAME,
        model=model or synthetic_model("1"),
        traffic={
            "provider": "gateway-api",
            "parentRefs": [{"name": "gateway"}],
            **sections.pop("traffic", {}),
        },
        rollout={
            "steps": STEPS,
            "interval": f"{interval_s:g}s",
            "progressDeadline": progress_deadline,
            "analysis": settings,
            **(rollout or {}),
        },
        **sections,
    )


def service_status(env: RolloutEnv, name: str = NAME) -> JsonObject:
    """The InferenceService's status (empty before the operator first writes it)."""
    return fsvc_status(env.kube, env.namespace, name)


def stable_status(env: RolloutEnv, version: str, name: str = NAME) -> JsonObject | None:
    """The status once `version` is stable and the rollout has Succeeded; None before."""
    status = service_status(env, name)
    done = status.get("stableVersion") == version and status.get("phase") == "Succeeded"
    return status if done else None


def wait_phase(env: RolloutEnv, phase: str, timeout_s: float) -> JsonObject:
    """Wait until status reports `phase`; return that status."""

    def reached() -> JsonObject | None:
        status = service_status(env)
        return status if status.get("phase") == phase else None

    return wait_until(reached, timeout_s=timeout_s, what=f"phase {phase}")


def deploy(
    env: RolloutEnv,
    mode: str = "threshold",
    model: dict[str, str] | None = None,
    interval_s: float = INTERVAL_S,
    **settings: Any,
) -> JsonObject:
    """Create the service (see `rollout_service`) and wait until version 1 serves."""
    env.kube.create(
        fsvc_path(env.namespace),
        rollout_service(env.prometheus, mode, model, interval_s, **settings),
    )
    return wait_until(lambda: stable_status(env, "1"), timeout_s=90.0, what="version 1 to serve")


def roll_out(env: RolloutEnv, model: dict[str, str]) -> None:
    """Start a rollout to `model`."""
    env.kube.merge_patch(fsvc_path(env.namespace, NAME), {"spec": {"model": model}})


def event_reasons(env: RolloutEnv) -> list[str]:
    """The reasons of the Events posted on the InferenceService so far."""
    return [e["reason"] for e in service_events(env.kube, env.namespace, NAME)]


def wait_event_reasons(env: RolloutEnv, *reasons: str) -> list[str]:
    """Wait until Events with every one of `reasons` are posted; return all the reasons."""
    return wait_for_events(env.kube, env.namespace, NAME, *reasons)


def assert_promoted_once(operator: OperatorProcess) -> None:
    """The operator counted exactly one promotion.

    It counts as the transition's side effect, after the status write that promoted: a scrape
    right after that write can come first, so this waits for the count, then checks it is one.
    """
    counter = "fleetserve_operator_promotions"
    wait_until(lambda: operator.total(counter) >= 1, timeout_s=30.0, what="the promotion counted")
    assert operator.total(counter) == 1


def route_weights(env: RolloutEnv) -> dict[str, int]:
    """The HTTPRoute's weight per track."""
    return track_weights(env.kube.get(child_path("HTTPRoute", env.namespace, NAME)), NAME)


def failed_requests(load: LoadDriver) -> str:
    """What went wrong with the load, for an assertion message; empty when all answered 200.

    Each failed request with its track and time after the first request, beside the route
    changes the driver saw, so a failure at a switch of weights reads as one.
    """
    if not load.records:
        return "no request was sent"
    start = load.records[0].time
    failed = [
        f"{r.time - start:.2f}s {r.track} {r.status}" for r in load.records if r.status != 200
    ]
    if not failed:
        return ""
    routes = [f"{s.time - start:.2f}s {s.weights}" for s in load.routes]
    return f"{len(failed)} of {len(load.records)} failed: {failed[:20]}; routes seen: {routes}"
