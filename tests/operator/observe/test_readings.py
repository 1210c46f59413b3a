"""What a reconcile reads of a Deployment's or a pod's status: alike readings observe alike.

The child watch queues no reconcile for a status change that leaves the reading as it was,
so a reading must hold everything the observers read: two states with one reading must
give the same facts, fetches, failures and track status. Each state below is one a pod or
Deployment goes through (or fails in); every pair of them is compared.
"""

from __future__ import annotations

import itertools
import json

import pytest

from fleetserve_operator import contract, naming
from fleetserve_operator.naming import Track
from fleetserve_operator.observe import (
    deployment_reading,
    is_rolled_out,
    pod_reading,
    track_facts,
    track_fetches,
    track_status,
    workload_problem,
)
from fleetserve_operator.records import Manifest

LABELS = {naming.TRACK_LABEL: "stable", naming.SPEC_HASH_LABEL: "h1"}
STARTED = {"running": {"startedAt": "2026-12-06T08:00:00Z"}}
CRASHED = {"terminated": {"exitCode": 1, "reason": "Error", "message": "bad flag"}}
FETCHED = {"terminated": {"exitCode": 0, "message": json.dumps({"digest": "sha256:ab"})}}
FETCH_FAILED = {"terminated": {"exitCode": 1, "message": json.dumps({"reason": "DigestMismatch"})}}


def _deployment(status: Manifest) -> Manifest:
    init = [{"name": contract.FETCH_CONTAINER_NAME, "image": "fetch:1"}]
    runtime = [{"name": contract.CONTAINER_NAME, "image": "runtime:1"}]
    return {
        "metadata": {"name": "demo-stable", "labels": LABELS, "generation": 2},
        "spec": {"replicas": 2, "template": {"spec": {"initContainers": init,
                                                       "containers": runtime}}},
        "status": status,
    }  # fmt: skip


def _pod(status: Manifest) -> Manifest:
    return {"metadata": {"name": "demo-stable-abc", "labels": LABELS}, "status": status}


def _container(name: str, **state: object) -> Manifest:
    return {"name": name, "ready": False, "restartCount": 0, **state}


def _fetch(**state: object) -> Manifest:
    return _container(contract.FETCH_CONTAINER_NAME, **state)


def _runtime(**state: object) -> Manifest:
    return _container(contract.CONTAINER_NAME, **state)


DONE = [_fetch(state=FETCHED)]
POD_STATES = {
    "created": {},
    "scheduled": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    "fetching": {"phase": "Pending", "initContainerStatuses": [_fetch(state=STARTED)]},
    "fetched, not started": {"initContainerStatuses": DONE},
    "fetched": {"initContainerStatuses": DONE, "containerStatuses": [_runtime(state=STARTED)]},
    "ready": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "initContainerStatuses": DONE,
        "containerStatuses": [_runtime(state=STARTED, ready=True, started=True)],
    },
    "fetch failed": {"initContainerStatuses": [_fetch(state=FETCH_FAILED)]},
    "fetch backing off": {
        "initContainerStatuses": [
            _fetch(
                state={"waiting": {"reason": "CrashLoopBackOff"}},
                lastState=FETCH_FAILED,
                restartCount=1,
            )
        ]
    },  # fmt: skip
    "crash looping": {
        "initContainerStatuses": DONE,
        "containerStatuses": [
            _runtime(
                state={"waiting": {"reason": "CrashLoopBackOff"}}, lastState=CRASHED, restartCount=2
            )
        ],
    },  # fmt: skip
    "rerun after a crash": {
        "initContainerStatuses": DONE,
        "containerStatuses": [_runtime(state=STARTED, lastState=CRASHED, restartCount=3)],
    },
    "recovered after a crash": {
        "initContainerStatuses": DONE,
        "containerStatuses": [
            _runtime(state=STARTED, lastState=CRASHED, restartCount=3, ready=True)
        ],
    },
    "recovered after an OOM kill": {
        "initContainerStatuses": DONE,
        "containerStatuses": [
            _runtime(
                state=STARTED,
                restartCount=3,
                ready=True,
                lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            )
        ],
    },  # fmt: skip
    "image not pulled": {
        "initContainerStatuses": DONE,
        "containerStatuses": [
            _runtime(state={"waiting": {"reason": "ImagePullBackOff", "message": "no image"}})
        ],
    },
    "out of memory": {
        "initContainerStatuses": DONE,
        "containerStatuses": [
            _runtime(
                state=STARTED,
                restartCount=1,
                lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            )
        ],
    },  # fmt: skip
}
ROLLING = {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2}
UPDATED = {"type": "Available", "status": "False", "lastUpdateTime": "2026-12-06T08:00:00Z"}
DEPLOYMENT_STATES = {
    "created": {},
    "seen": {"observedGeneration": 2},
    "rolling": {**ROLLING, "unavailableReplicas": 2, "conditions": [UPDATED]},
    "rolling, a condition updated later": {
        **ROLLING,
        "unavailableReplicas": 2,
        "conditions": [{**UPDATED, "lastUpdateTime": "2026-12-06T08:00:09Z"}],
    },
    "one ready": {**ROLLING, "readyReplicas": 1, "availableReplicas": 1},
    "all ready": {**ROLLING, "readyReplicas": 2, "availableReplicas": 2},
    "all ready, its new generation not seen yet": {
        **ROLLING,
        "observedGeneration": 1,
        "readyReplicas": 2,
        "availableReplicas": 2,
    },
    "a surge pod still running": {
        **ROLLING,
        "replicas": 3,
        "readyReplicas": 2,
        "availableReplicas": 2,
    },
    "may not create pods": {
        **ROLLING,
        "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}],
    },
    "past its deadline": {
        **ROLLING,
        "conditions": [
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
        ],
    },  # fmt: skip
}


def _pod_observed(status: Manifest) -> tuple[object, ...]:
    deployment = _deployment({})
    pods = [_pod(status)]
    return (
        track_facts(deployment, pods),
        track_fetches({Track.STABLE: deployment}, pods),
        workload_problem({Track.STABLE: deployment}, pods),
    )


def _deployment_observed(status: Manifest) -> tuple[object, ...]:
    deployment = _deployment(status)
    pods = [_pod(POD_STATES["ready"])]
    return (
        track_facts(deployment, pods),
        track_status(deployment),
        is_rolled_out(deployment),
        workload_problem({Track.STABLE: deployment}, pods),
    )


@pytest.mark.parametrize(("one", "other"), list(itertools.combinations(POD_STATES, 2)))
def test_pod_states_read_alike_only_where_they_observe_alike(one: str, other: str) -> None:
    a, b = POD_STATES[one], POD_STATES[other]
    if pod_reading(_pod(a)) == pod_reading(_pod(b)):
        assert _pod_observed(a) == _pod_observed(b)


@pytest.mark.parametrize(("one", "other"), list(itertools.combinations(DEPLOYMENT_STATES, 2)))
def test_deployment_states_read_alike_only_where_they_observe_alike(one: str, other: str) -> None:
    a, b = DEPLOYMENT_STATES[one], DEPLOYMENT_STATES[other]
    if deployment_reading(_deployment(a)) == deployment_reading(_deployment(b)):
        assert _deployment_observed(a) == _deployment_observed(b)


def test_a_pods_start_and_readiness_are_one_reading_and_each_failure_another() -> None:
    """Which pod events are news: what this is for, and what it must never hide."""

    def reading(state: str) -> tuple[object, ...]:
        return pod_reading(_pod(POD_STATES[state]))

    assert reading("created") == reading("scheduled") == reading("fetching")
    assert reading("fetched, not started") == reading("fetched") == reading("ready")
    same = ("scheduled", "fetching", "fetched", "ready")
    others = [state for state in POD_STATES if state not in same]
    readings = [reading(state) for state in others]
    assert len(set(map(repr, readings))) == len(others), "every other state reads apart"


def test_a_deployments_condition_timestamps_are_one_reading_its_counts_and_failures_another() -> (
    None
):
    def reading(state: str) -> tuple[object, ...]:
        return deployment_reading(_deployment(DEPLOYMENT_STATES[state]))

    assert reading("created") == reading("seen"), "rolled out in neither"
    assert reading("rolling") == reading("rolling, a condition updated later")
    surge, unseen = "a surge pod still running", "all ready, its new generation not seen yet"
    assert reading(surge) == reading(unseen), "ready, not rolled out, in both"
    others = [
        state
        for state in DEPLOYMENT_STATES
        if state not in ("seen", "rolling, a condition updated later", surge)
    ]
    readings = [reading(state) for state in others]
    assert len(set(map(repr, readings))) == len(others), "every other state reads apart"
