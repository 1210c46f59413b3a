"""A manual gate holds a rollout across an operator restart, and the approve annotation opens it.

Version 2 rolls out over steps 50 and 100 with a 2 s interval and no analysis (a step
passes on readiness and time), the 50% step gated. The operator that saw the step start is
stopped while the step awaits approval; a new one keeps the wait (the same `waitingSince`,
several intervals later: nothing in memory restarted it), and `approve=50` promotes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fleetserve_e2e import KubeClient
from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.operator_process import OperatorProcess, fsvc_path, fsvc_status
from fleetserve_e2e.operator_testing import synthetic_service, wait_for_events
from fleetserve_e2e.rollout_testing import ROLLOUT_SETTINGS
from fleetserve_e2e.waiting import wait_until

NAME = "gated"
APPROVE = "serving.fleetserve.io/approve"
DRY_RUN = {"dryRun": "All"}
ROLLOUT = {
    "steps": [50, 100],
    "interval": "2s",
    "progressDeadline": "2m",
    "stepPolicies": [{"weight": 50, "gate": "manual"}],
}


def _gate(kube: KubeClient, namespace: str) -> dict[str, Any] | None:
    """The step gate while the 50% step awaits approval, else None."""
    status = fsvc_status(kube, namespace, NAME)
    gate: dict[str, Any] = status.get("rollout", {}).get("stepGate", {})
    awaiting = gate.get("waiting") == "AwaitingApproval" and status.get("canaryWeight") == 50
    return gate if awaiting else None


def test_a_manual_gate_survives_an_operator_restart(
    kube: KubeClient, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    """Awaiting approval at 50% before and after a restart; approving promotes version 2."""
    first = start_operator(ROLLOUT_SETTINGS)
    kube.create(fsvc_path(namespace), synthetic_service(NAME, rollout=ROLLOUT))
    wait_until(
        lambda: fsvc_status(kube, namespace, NAME).get("phase") == "Succeeded",
        timeout_s=60.0,
        what="version 1 to serve",
    )
    model = {"name": NAME, "version": "2", "uri": "builtin://synthetic?latency_ms=1"}
    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"model": model}})
    before = wait_until(
        lambda: _gate(kube, namespace), timeout_s=60.0, what="the 50% step to await approval"
    )
    wait_for_events(kube, namespace, NAME, "AwaitingApproval")
    first.stop()

    start_operator(ROLLOUT_SETTINGS)
    time.sleep(5.0)  # more than two intervals: each passes, and the step keeps waiting
    after = _gate(kube, namespace)
    assert after is not None, fsvc_status(kube, namespace, NAME)
    assert (after["startedAt"], after["waitingSince"]) == (
        before["startedAt"],
        before["waitingSince"],
    )

    patch = {"metadata": {"annotations": {APPROVE: "50"}}}
    kube.merge_patch(fsvc_path(namespace, NAME), patch)
    wait_until(
        lambda: fsvc_status(kube, namespace, NAME).get("stableVersion") == "2",
        timeout_s=60.0,
        what="version 2 to be promoted",
    )
    wait_for_events(kube, namespace, NAME, "StepApproved", "Promoted")
    annotations = kube.get(fsvc_path(namespace, NAME))["metadata"].get("annotations", {})
    assert APPROVE not in annotations


def test_the_api_server_accepts_both_kinds_of_webhook(crd: LocalCluster, namespace: str) -> None:
    """The webhooks' CEL rules (events by type, `duration()` of the timeout) admit valid ones."""
    webhooks = [
        {"name": "chat", "url": "https://hooks.example.com/", "events": ["Promoted"]},
        {"name": "window", "type": "confirm", "url": "http://window:8080/", "timeout": "10s"},
    ]
    service = synthetic_service(NAME, rollout={**ROLLOUT, "webhooks": webhooks})
    created = crd.client.request("POST", fsvc_path(namespace), body=service, params=DRY_RUN)
    assert [hook["name"] for hook in created["spec"]["rollout"]["webhooks"]] == ["chat", "window"]
