"""Failures after the children were applied: the pure classification, and what status says."""

from __future__ import annotations

import pytest

from fleetserve_operator import naming
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.naming import Track
from fleetserve_operator.observe.facts import MAX_MESSAGE, track_facts, workload_problem
from fleetserve_operator.records import Manifest, Problem
from fleetserve_operator.spec import ConditionType
from fleetserve_operator.testing import FakeKube, make_service

LABELS = {naming.TRACK_LABEL: "stable", naming.SPEC_HASH_LABEL: "h1"}
CRASHED = {"exitCode": 1, "reason": "Error", "message": "unknown model parameter 'bogus'"}


def _deployment(*conditions: Manifest) -> Manifest:
    return {
        "metadata": {"name": "demo-stable", "labels": LABELS, "generation": 1},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "conditions": list(conditions)},
    }


def _pod(container: Manifest, spec_hash: str = "h1") -> Manifest:
    labels = {**LABELS, naming.SPEC_HASH_LABEL: spec_hash}
    status = {"name": "runtime", "ready": False, "restartCount": 0, **container}
    return {"metadata": {"name": "demo-stable-abc", "labels": labels},
            "status": {"containerStatuses": [status]}}  # fmt: skip


def _problem(*pods: Manifest, deployment: Manifest | None = None) -> Problem | None:
    return workload_problem({Track.STABLE: deployment or _deployment()}, pods)


def test_crash_at_start_reads_the_same_while_waiting_and_while_rerunning() -> None:
    """CrashLoopBackOff with the last run's exit, whether the kubelet waits or has restarted it.

    Between two crashes the container runs (not ready); status must not flap with that.
    """
    waiting = _pod({
        "restartCount": 2,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
        "lastState": {"terminated": CRASHED},
    })  # fmt: skip
    rerunning = _pod({
        "restartCount": 3,
        "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}},
        "lastState": {"terminated": CRASHED},
    })  # fmt: skip
    problem = _problem(waiting)
    assert problem is not None
    assert problem.reason == "CrashLoopBackOff"
    assert "pod demo-stable-abc container runtime keeps exiting" in problem.message
    assert "exited with code 1 (Error): unknown model parameter 'bogus'" in problem.message
    assert _problem(rerunning) == problem


@pytest.mark.parametrize(
    ("container", "reason", "quoted"),
    [
        pytest.param(
            {"state": {"waiting": {"reason": "ImagePullBackOff",
                                   "message": 'Back-off pulling image "ghcr.io/x:9"'}}},
            "ImagePullBackOff", 'Back-off pulling image "ghcr.io/x:9"', id="image-pull",
        ),
        pytest.param(
            {"state": {"waiting": {"reason": "CreateContainerConfigError",
                                   "message": 'secret "hf-token" not found'}}},
            "CreateContainerConfigError", 'secret "hf-token" not found', id="config-error",
        ),
        pytest.param(
            {"restartCount": 1, "state": {"running": {}},
             "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
            "OOMKilled", "exited with code 137 (OOMKilled)", id="oom-killed",
        ),
    ],
)  # fmt: skip
def test_the_pods_own_reason_and_message(container: Manifest, reason: str, quoted: str) -> None:
    """The reason is the kubelet's and the message quotes it, naming pod and container."""
    problem = _problem(_pod(container))
    assert problem is not None
    assert problem.reason == reason
    assert quoted in problem.message
    assert problem.message.startswith("pod demo-stable-abc container runtime")


@pytest.mark.parametrize(
    ("condition", "reason", "message"),
    [
        pytest.param(
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
             "message": 'pods "demo-stable-x" is forbidden: serviceaccount "gpu" not found'},
            "FailedCreate", 'pods "demo-stable-x" is forbidden: serviceaccount "gpu" not found',
            id="replicaset-may-not-create-pods",
        ),
        pytest.param(
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": 'ReplicaSet "demo-stable-x" has timed out progressing.'},
            "ProgressDeadlineExceeded", 'ReplicaSet "demo-stable-x" has timed out progressing.',
            id="never-ready",
        ),
    ],
)  # fmt: skip
def test_what_the_deployment_says(condition: Manifest, reason: str, message: str) -> None:
    """The Deployment's ReplicaFailure, or its missed progress deadline, with its message."""
    problem = _problem(deployment=_deployment(condition))
    assert problem == Problem(reason, f"Deployment demo-stable: {message}")


@pytest.mark.parametrize(
    "container",
    [
        pytest.param({"state": {"running": {}}, "ready": True}, id="serving"),
        pytest.param({"state": {"waiting": {"reason": "ContainerCreating"}}}, id="starting"),
        pytest.param({"state": {"running": {}}}, id="loading-the-model"),
        pytest.param(
            {
                "restartCount": 1,
                "state": {"running": {}},
                "ready": True,
                "lastState": {"terminated": CRASHED},
            },
            id="recovered",
        ),  # fmt: skip
    ],
)
def test_pods_on_their_way_are_no_problem(container: Manifest) -> None:
    """Starting, loading, serving or recovered from a crash: nothing to report."""
    assert _problem(_pod(container)) is None


def test_pods_of_an_older_template_are_not_held_against_the_new_one() -> None:
    """A crashing pod that a rolling update is replacing does not count."""
    old = _pod({"state": {"waiting": {"reason": "CrashLoopBackOff"}}}, spec_hash="h0")
    assert _problem(old) is None


def test_a_long_message_is_cut() -> None:
    """Status carries at most MAX_MESSAGE characters of what a pod said."""
    terminated = {**CRASHED, "message": "x" * 10_000}
    problem = _problem(_pod({"restartCount": 1, "lastState": {"terminated": terminated}}))
    assert problem is not None
    assert len(problem.message) == MAX_MESSAGE


def test_a_crashing_stable_track_is_not_ready_and_degraded() -> None:
    """Through a reconcile: Ready False and Degraded True with the pod's reason, and an Event."""
    kube = FakeKube()
    kube.add_service(make_service())
    sync = Sync(kube, metrics=OperatorMetrics())
    sync.run_by_name("ns", "demo", trigger="create")
    kube.add_pod("demo-stable", restarts=2, reason="Error")
    sync.run_by_name("ns", "demo", trigger="child")
    status = kube.status_of("ns", "demo")
    ready, degraded = (status.condition(c) for c in (ConditionType.READY, ConditionType.DEGRADED))
    assert ready is not None
    assert degraded is not None
    assert (ready.status, ready.reason) == ("False", "CrashLoopBackOff")
    assert (degraded.status, degraded.reason) == ("True", "CrashLoopBackOff")
    assert "keeps exiting" in degraded.message
    assert status.last_error == degraded.message
    warnings = [e for e in kube.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["CrashLoopBackOff"]


def _fetching_pod(fetch: Manifest) -> Manifest:
    """A pod whose runtime container waits for its `fetch` init container."""
    pod = _pod({"state": {"waiting": {"reason": "PodInitializing"}}})
    pod["status"]["initContainerStatuses"] = [{"name": "fetch", "restartCount": 0, **fetch}]
    return pod


REPORTED = '{"reason": "AccessDenied", "message": "s3://models/enc: InvalidAccessKeyId"}'


@pytest.mark.parametrize(
    "fetch",
    [
        pytest.param({"state": {"terminated": {"exitCode": 1, "message": REPORTED}}},
                     id="just-failed"),
        pytest.param({"restartCount": 1,
                      "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                      "lastState": {"terminated": {"exitCode": 1, "message": REPORTED}}},
                     id="backing-off"),
    ],
)  # fmt: skip
def test_a_failed_fetch_is_reported_with_its_own_reason(fetch: Manifest) -> None:
    """The reason the fetch wrote is the service's reason, its message quoted, pod named."""
    problem = _problem(_fetching_pod(fetch))
    assert problem == Problem(
        "AccessDenied",
        "pod demo-stable-abc: model fetch failed: s3://models/enc: InvalidAccessKeyId",
    )


@pytest.mark.parametrize(
    ("message", "quoted"),
    [
        pytest.param("", "exit code 137 (OOMKilled)", id="killed"),
        pytest.param('{"reason": "RmRfSlash", "message": "x"}',
                     'exit code 137 (OOMKilled): {"reason": "RmRfSlash"', id="unknown-reason"),
        pytest.param("Traceback (most recent call last)",
                     "exit code 137 (OOMKilled): Traceback", id="not-json"),
    ],
)  # fmt: skip
def test_a_fetch_that_died_without_a_report_is_a_fetch_failure(message: str, quoted: str) -> None:
    """Only the known reasons are taken from the fetch; anything else is ModelFetchFailed."""
    ended = {"exitCode": 137, "reason": "OOMKilled", "message": message}
    problem = _problem(_fetching_pod({"state": {"terminated": ended}}))
    assert problem is not None
    assert problem.reason == "ModelFetchFailed"
    assert quoted in problem.message


@pytest.mark.parametrize(
    "fetch",
    [
        pytest.param({"state": {"running": {}}}, id="fetching"),
        pytest.param({"state": {"terminated": {"exitCode": 0, "message": "{}"}}}, id="done"),
    ],
)
def test_a_fetch_under_way_or_done_is_no_problem(fetch: Manifest) -> None:
    """The runtime container waiting on its fetch is a start in progress."""
    assert _problem(_fetching_pod(fetch)) is None


def test_a_failed_fetch_reaches_the_tracks_facts() -> None:
    """The rollout sees the fetch's reason (it rolls a canary back with it) and the restart."""
    fetch = {"restartCount": 1, "state": {"running": {}},
             "lastState": {"terminated": {"exitCode": 1, "message": REPORTED}}}  # fmt: skip
    facts = track_facts(_deployment(), [_fetching_pod(fetch)])
    assert facts is not None
    assert facts.restarts == 1
    assert facts.fetch_failure == (
        "AccessDenied",
        "pod demo-stable-abc: model fetch failed: s3://models/enc: InvalidAccessKeyId",
    )
