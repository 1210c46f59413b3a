"""The pod status the fake kubelet writes: init containers and termination reasons."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pod_status import Observation, pod_status

NOW = "2026-01-01T00:00:00Z"
POD: JsonObject = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
    "spec": {"containers": [{"name": "runtime", "image": "img"}]},
    "status": {},
}
FAILED_INIT: JsonObject = {
    "name": "fetch",
    "restartCount": 1,
    "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": "{}"}},
}


def _seen(**changes: Any) -> Observation:
    base = Observation(started_at=NOW, ready_changed_at=NOW, running=True, ready=True)
    return replace(base, **changes)


def test_a_pod_whose_init_containers_run_is_pending_and_initializing() -> None:
    seen = _seen(initialized=False, running=False, ready=False, init_statuses=(FAILED_INIT,))
    status = pod_status(POD, seen)
    assert status["phase"] == "Pending"
    initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False"
    assert status["initContainerStatuses"] == [FAILED_INIT]
    (runtime,) = status["containerStatuses"]
    assert runtime["state"] == {"waiting": {"reason": "PodInitializing"}}


def test_a_pod_without_init_containers_reports_none() -> None:
    status = pod_status(POD, _seen())
    assert status["phase"] == "Running"
    assert "initContainerStatuses" not in status


def test_the_runners_termination_reason_wins_over_the_exit_codes() -> None:
    seen = _seen(last_exit_code=137, last_finished_at=NOW, last_reason="OOMKilled")
    (runtime,) = pod_status(POD, seen)["containerStatuses"]
    assert runtime["lastState"]["terminated"]["reason"] == "OOMKilled"
    (plain,) = pod_status(POD, _seen(last_exit_code=137, last_finished_at=NOW))["containerStatuses"]
    assert plain["lastState"]["terminated"]["reason"] == "Error"


def test_a_pod_that_cannot_be_created_is_pending_with_the_reason() -> None:
    """A missing Secret: Pending, the container waiting with the kubelet's reason and message."""
    why = ("CreateContainerConfigError", "secret 'store-keys' does not exist")
    seen = _seen(initialized=False, running=False, ready=False, waiting=why)
    status = pod_status(POD, seen)
    assert status["phase"] == "Pending"
    (runtime,) = status["containerStatuses"]
    assert runtime["state"] == {"waiting": {"reason": why[0], "message": why[1]}}
    assert not runtime["ready"]
