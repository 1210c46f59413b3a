"""Two operators, one leader: killing it mid-rollout hands over, and the rollout goes on.

Both operators run as the shipped role's account and compete for one Lease in the test's
namespace (`operator_process` names it), each with its own `POD_NAME`, as two replicas of the
chart's Deployment would. The leader is SIGKILLed while a canary rollout sits at its second
step. The standby must take the Lease and reconcile again within 15 s (printed as
`handover_s=`), and watches on the InferenceService and its HTTPRoute record every version
from before the kill on: the step index and the canary's weight never go back, and the
rollout completes. Until it leads the standby writes nothing (its write counter stays 0).

A clean stop (SIGTERM, as in a rolling update of the operator) releases the Lease: a watch on
it sees the holder cleared before the standby takes it, without waiting out the lease
(`release_handover_s=` is from the leader's exit to the standby leading).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.loadgen import canary_weight
from fleetserve_e2e.operator_process import OperatorProcess, child_path, fsvc_path
from fleetserve_e2e.operator_testing import synthetic_service
from fleetserve_e2e.rollout_testing import ROLLOUT_SETTINGS
from fleetserve_e2e.testing import watch_history
from fleetserve_e2e.waiting import wait_until

NAME = "demo"
LEASE = "fleetserve-operator"
STEPS = [25, 50, 75, 100]
INTERVAL_S = 8
"""Under the 10 s lease: the second step falls due while the standby waits out the dead
leader's lease, so the new leader must take the rollout on from the step in `.status`."""
HANDOVER_BOUND_S = 15.0
LEADER_GAUGE = "fleetserve_operator_leader"


def _lease(kube: KubeClient, namespace: str) -> JsonObject:
    return kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")


def _sample(operator: OperatorProcess, name: str) -> float:
    """The sum of `name`'s samples in the operator's /metrics (0 when it exports none)."""
    text = httpx.get(operator.metrics_url, timeout=5.0, trust_env=False).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def _leads(operator: OperatorProcess) -> bool:
    return _sample(operator, LEADER_GAUGE) == 1.0


def _writes(operator: OperatorProcess) -> float:
    return _sample(operator, "fleetserve_operator_writes_total")


@dataclass(frozen=True)
class Pair:
    """Two operators competing for the Lease of the test's namespace, and where they run."""

    kube: KubeClient
    namespace: str
    cluster: LocalCluster
    leader: OperatorProcess
    standby: OperatorProcess


@pytest.fixture
def pair(
    kube: KubeClient,
    namespace: str,
    local_cluster: LocalCluster,
    start_operator: Callable[..., OperatorProcess],
) -> Pair:
    """A leader (started first, so it creates the Lease) and a standby."""
    leader = start_operator({**ROLLOUT_SETTINGS, "POD_NAME": "operator-a"})
    wait_until(lambda: _leads(leader), timeout_s=30.0, what="the first operator to lead")
    standby = start_operator({**ROLLOUT_SETTINGS, "POD_NAME": "operator-b"})
    assert not _leads(standby)
    return Pair(kube, namespace, local_cluster, leader, standby)


def _step(service: JsonObject) -> tuple[int, int]:
    """(status.rollout.stepIndex, status.canaryWeight); -1 before the first step."""
    status = service.get("status", {})
    step = status.get("rollout", {}).get("stepIndex")
    return (-1 if step is None else step, status.get("canaryWeight", 0))


def _until_promotion(weights: list[int]) -> list[int]:
    """The route's canary weights before the promotion withdrew the canary (weight 0)."""
    end = len(weights)
    while end > 1 and weights[end - 1] == 0:
        end -= 1
    return weights[:end]


def test_killing_the_leader_mid_rollout_hands_over_and_the_rollout_continues(pair: Pair) -> None:
    """Handover within 15 s; step and weight never go back; the rollout completes."""
    kube, namespace, standby = pair.kube, pair.namespace, pair.standby
    rollout = {"steps": STEPS, "interval": f"{INTERVAL_S}s", "progressDeadline": "5m"}
    traffic = {"provider": "gateway-api", "parentRefs": [{"name": "gateway"}]}
    kube.create(fsvc_path(namespace), synthetic_service(NAME, traffic=traffic, rollout=rollout))
    wait_until(lambda: kube.get(fsvc_path(namespace, NAME)).get("status", {}).get("phase")
               == "Succeeded", timeout_s=90.0, what="version 1 to serve")  # fmt: skip
    model = {"name": NAME, "version": "2", "uri": "builtin://synthetic?latency_ms=1"}
    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"model": model}})
    wait_until(lambda: _step(kube.get(fsvc_path(namespace, NAME)))[0] == 1,
               timeout_s=120.0, what="the rollout's second step")  # fmt: skip

    service = kube.get(fsvc_path(namespace, NAME))
    route = kube.get(child_path("HTTPRoute", namespace, NAME))
    with (
        watch_history(pair.cluster, fsvc_path(namespace), service, _step) as steps,
        watch_history(
            pair.cluster,
            child_path("HTTPRoute", namespace),
            route,
            lambda manifest: canary_weight(manifest, NAME),
        ) as weights,
    ):
        assert _writes(standby) == 0, "the standby wrote before it led"
        assert _sample(standby, "fleetserve_operator_reconciles_total") == 0
        assert _lease(kube, namespace)["spec"]["holderIdentity"].startswith("operator-a_")
        at_kill = steps[-1]
        pair.leader.kill()
        killed_at = time.monotonic()
        wait_until(lambda: _leads(standby), timeout_s=60.0, what="the standby to lead")
        led_at = time.monotonic()
        wait_until(lambda: _sample(standby, "fleetserve_operator_reconciles_total") > 0,
                   timeout_s=60.0, what="the new leader to reconcile")  # fmt: skip
        handover_s = time.monotonic() - killed_at
        print(f"lease_taken_s={led_at - killed_at:.2f} handover_s={handover_s:.2f}")
        assert handover_s <= HANDOVER_BOUND_S
        assert _lease(kube, namespace)["spec"]["holderIdentity"].startswith("operator-b_")

        def done() -> bool:
            status = kube.get(fsvc_path(namespace, NAME)).get("status", {})
            return status.get("phase") == "Succeeded" and status.get("stableVersion") == "2"

        wait_until(done, timeout_s=30.0 + INTERVAL_S * len(STEPS), what="the rollout to complete")
    # From the kill on, until the promotion ends the rollout (no step, no canary weight).
    resumed = [step for step in steps[steps.index(at_kill) :] if step[0] >= 0 and step[1] > 0]
    assert resumed == sorted(resumed), f"the step or its weight went back: {steps}"
    assert resumed[-1][0] > at_kill[0], f"no step after the handover: {steps}"
    routed = _until_promotion(weights)
    assert routed == sorted(routed), f"the route's canary weight went back: {weights}"
    assert routed[-1] > at_kill[1], f"the route never moved on: {weights}"
    assert _writes(standby) > 0


def test_a_stopped_leader_releases_the_lease_so_the_standby_leads_at_once(pair: Pair) -> None:
    """SIGTERM: the leader clears the holder; the standby need not wait out the lease."""
    lease = _lease(pair.kube, pair.namespace)
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{pair.namespace}/leases"
    with watch_history(
        pair.cluster, leases, lease, lambda obj: obj["spec"].get("holderIdentity")
    ) as holders:
        pair.leader.stop()
        stopped_at = time.monotonic()
        assert pair.leader.process.popen.returncode == 0, "the leader did not stop cleanly"
        wait_until(lambda: _leads(pair.standby), timeout_s=60.0, what="the standby to lead")
        print(f"release_handover_s={time.monotonic() - stopped_at:.2f}")
    changes = [holder for i, holder in enumerate(holders) if i == 0 or holder != holders[i - 1]]
    owners = [(holder or "").split("_")[0] for holder in changes]
    assert owners == ["operator-a", "", "operator-b"], f"holders: {holders}"
    assert _lease(pair.kube, pair.namespace)["spec"]["leaseTransitions"] == 1
