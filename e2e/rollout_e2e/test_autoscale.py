"""Autoscaling on in-flight requests: the operator's ScaledObject, real KEDA, the real HPA.

KEDA (built from its pinned module, ``fleetserve_e2e.keda``) joins the session cluster for
this module. The InferenceService asks for 1-4 stable replicas holding 2 in-flight requests
each; the operator renders a KEDA ScaledObject whose Prometheus trigger sums the runtime's
``fleetserve_inflight_requests`` gauge over the stable track, KEDA creates the HPA, and the
kube-controller-manager's HPA controller (3 s sync in the harness) sets the Deployment's
replicas. A bounded ramp of slow synthetic requests (500 ms each, ~7 in flight) must take the
track from 1 to at least 3 replicas; it runs on for a while at 3, then stops, and the track
must return to 1, with no failed request; the load driver spreads over the ready pods it
finds in the pod map, so replicas appearing mid-ramp take traffic as they become ready. The
test prints ``time_to_scale_up_s=`` and ``time_to_scale_down_s=``.

A second test runs a canary step while the HPA grows the stable track: the canary's size
must follow the stable Deployment's current size (weight x replicas, not the spec's minimum),
and the sequential analysis, watching replicas of both tracks appear mid-step, must promote
the good version with no failed request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleetserve_e2e import LocalCluster, LocalPrometheus
from fleetserve_e2e.keda import LocalKeda
from fleetserve_e2e.loadgen import LoadDriver
from fleetserve_e2e.operator_process import (
    INSTANCE_LABEL,
    TRACK_LABEL,
    child_path,
    fsvc_path,
    get_or_none,
)
from fleetserve_e2e.operator_testing import synthetic_service
from fleetserve_e2e.rollout_testing import RolloutEnv, service_status, stable_status
from fleetserve_e2e.testing import is_pod_ready, list_pods
from fleetserve_e2e.waiting import wait_until

NAME = "scaled"
LATENCY_MS = 500
SCALING = {
    "minReplicas": 1,
    "maxReplicas": 4,
    "metric": "inflightRequests",
    "target": 2,
    "scaleUpWindowSeconds": 0,
    "scaleDownWindowSeconds": 10,
    "pollingIntervalSeconds": 2,
}
RAMP_S = 90.0
"""Long enough for two replicas of the venv runtime to start on two busy cores."""
HOLD_S = 15.0
"""How long the first test's ramp runs on once 3 replicas are ready, so they all answer part
of it (about 200 requests), before it stops and the track scales back down."""
# 16 sequential workers at 14 requests/s in all: each waits 500 ms for its answer, so about
# 16 * 0.5 / (16 / 14) = 7 requests are in flight whatever the replica count: ceil(7 / 2) = 4.
RAMP_RPS = 14.0
RAMP_WORKERS = 16
SCALE_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def keda(local_cluster: LocalCluster) -> Iterator[LocalKeda]:
    """KEDA's operator and metrics API server, attached to the session cluster."""
    with LocalKeda(local_cluster) as running:
        yield running


def _model(version: str) -> dict[str, str]:
    return {"name": NAME, "version": version, "uri": f"builtin://synthetic?latency_ms={LATENCY_MS}"}


def _service(
    prometheus: LocalPrometheus, scaling: dict[str, Any] = SCALING, **rollout: Any
) -> dict[str, Any]:
    return synthetic_service(
        NAME,
        model=_model("1"),
        traffic={"provider": "gateway-api", "parentRefs": [{"name": "gateway"}]},
        rollout={
            **rollout,
            "analysis": {"prometheusUrl": prometheus.url, **rollout.pop("analysis", {})},
        },
        scaling=scaling,
    )


def _ready_replicas(env: RolloutEnv) -> int:
    selector = f"{INSTANCE_LABEL}={NAME},{TRACK_LABEL}=stable"
    return sum(map(is_pod_ready, list_pods(env.kube, env.namespace, selector)))


def _wanted_replicas(env: RolloutEnv) -> int:
    deployment = env.kube.get(child_path("Deployment", env.namespace, f"{NAME}-stable"))
    replicas: int = deployment["spec"].get("replicas", 1)
    return replicas


def _ramp(env: RolloutEnv, duration_s: float) -> LoadDriver:
    """The bounded ramp both tests drive: ~7 slow requests in flight for `duration_s`."""
    return LoadDriver(
        env.cluster,
        env.namespace,
        NAME,
        NAME,
        rate_rps=RAMP_RPS,
        duration_s=duration_s,
        concurrency=RAMP_WORKERS,
    )


def test_inflight_ramp_scales_stable_track_up_and_back_down(
    keda: LocalKeda, env: RolloutEnv
) -> None:
    """1 → ≥ 3 replicas under the ramp, back to 1 after it, every request answered 200."""
    env.start_operator()
    env.kube.create(fsvc_path(env.namespace), _service(env.prometheus))
    scaled_object = f"/apis/keda.sh/v1alpha1/namespaces/{env.namespace}/scaledobjects"
    wait_until(
        lambda: env.kube.get(scaled_object)["items"],
        timeout_s=60.0,
        what="the operator's ScaledObject",
    )
    hpa = f"/apis/autoscaling/v2/namespaces/{env.namespace}/horizontalpodautoscalers"
    wait_until(lambda: env.kube.get(hpa)["items"], timeout_s=60.0, what="KEDA's HPA")
    wait_until(
        lambda: (
            _ready_replicas(env) == 1
            and get_or_none(env.kube, child_path("HTTPRoute", env.namespace, NAME))
        ),
        timeout_s=90.0,
        what="one ready stable replica and the route",
    )

    with _ramp(env, SCALE_TIMEOUT_S + HOLD_S) as load:
        started = time.monotonic()
        scaled_up_to = wait_until(
            lambda: (n := _ready_replicas(env)) >= 3 and n,
            timeout_s=SCALE_TIMEOUT_S,
            what="the stable track to reach 3 ready replicas",
            interval_s=0.5,
        )
        time_to_scale_up_s = time.monotonic() - started
        time.sleep(HOLD_S)
    ramp_end = time.monotonic()
    wait_until(
        lambda: _wanted_replicas(env) == 1 and _ready_replicas(env) == 1,
        timeout_s=SCALE_TIMEOUT_S,
        what="the stable track back at 1 replica",
        interval_s=0.5,
    )
    time_to_scale_down_s = time.monotonic() - ramp_end

    statuses = [record.status for record in load.records]
    ramp_s = ramp_end - started
    assert len(statuses) > RAMP_RPS * ramp_s / 2, f"only {len(statuses)} requests were sent"
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    print(
        f"requests={len(statuses)} scaled_up_to={scaled_up_to} "
        f"time_to_scale_up_s={time_to_scale_up_s:.1f} "
        f"time_to_scale_down_s={time_to_scale_down_s:.1f}"
    )


STEP_WEIGHT = 50
"""One canary step at 50 %, long enough for the HPA to grow the stable track within it."""
STEP_S = 50.0
PROMOTION_S = RAMP_S + 2 * STEP_S


def test_a_canary_step_follows_the_stable_track_as_it_scales_and_is_promoted(
    keda: LocalKeda, env: RolloutEnv
) -> None:
    """Mid-step, stable grows to ≥ 3; the canary holds ceil(50 % x stable); v2 is promoted."""
    env.start_operator()
    # One request in flight per replica: half of the ~7 in flight on each track asks for 4.
    scaling = {**SCALING, "target": 1}
    service = _service(
        env.prometheus,
        scaling,
        steps=[STEP_WEIGHT, 100],
        interval=f"{STEP_S:g}s",
        progressDeadline="5m",
        # Not a test of power: a 10x regression is ruled out in about 50 canary requests.
        analysis={
            "mode": "sequential",
            "window": "10s",
            "minRequests": 5,
            "minDetectableRatio": 10.0,
        },
    )
    env.kube.create(fsvc_path(env.namespace), service)
    wait_until(
        lambda: (
            _ready_replicas(env) == 1
            and get_or_none(env.kube, child_path("HTTPRoute", env.namespace, NAME))
            and service_status(env, NAME).get("phase") == "Succeeded"
        ),
        timeout_s=90.0,
        what="version 1 serving from one ready replica",
    )
    followed: list[tuple[int, int]] = []

    def canary_follows_a_grown_stable() -> bool:
        status = service_status(env, NAME)
        if status.get("phase") != "Progressing":
            return False
        stable = _wanted_replicas(env)
        canary = get_or_none(env.kube, child_path("Deployment", env.namespace, f"{NAME}-canary"))
        if canary is None or stable < 3:
            return False
        followed.append((stable, canary["spec"].get("replicas", 1)))
        return followed[-1][1] == math.ceil(STEP_WEIGHT / 100 * stable)

    # The analysis needs traffic until promotion: on a slow machine the canary's pods take
    # part of the step to start, so the load lasts two steps past the ramp.
    with _ramp(env, PROMOTION_S) as load:
        env.kube.merge_patch(fsvc_path(env.namespace, NAME), {"spec": {"model": _model("2")}})
        wait_until(
            canary_follows_a_grown_stable,
            timeout_s=STEP_S,
            what="the canary to follow a grown stable track within the step",
            interval_s=0.5,
        )
        promoted = wait_until(
            lambda: stable_status(env, "2", NAME), timeout_s=PROMOTION_S, what="version 2 promoted"
        )
    statuses = [record.status for record in load.records]
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    verdicts = [a["verdict"] for a in promoted["rollout"]["analyses"]]
    assert "Failed" not in verdicts, promoted["rollout"]["analyses"]
    print(f"requests={len(statuses)} stable_and_canary_replicas={followed[-1]}")
