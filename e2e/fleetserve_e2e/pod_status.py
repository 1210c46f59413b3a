"""Build the pod status a kubelet would report, from what the harness observed (pure).

The status carries the fields controllers and users read: phase, the PodScheduled /
Initialized / ContainersReady / Ready conditions, podIP 127.0.0.1, and one containerStatus per
container with ``ready``, ``started``, ``restartCount``, ``state`` and ``lastState``.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from fleetserve_e2e.kubeapi import JsonObject

LOCAL_IP = "127.0.0.1"


@dataclass(frozen=True)
class Observation:
    """What the harness knows about a pod's (single, shared) container state.

    ``running`` is False while a crashed process waits for its restart; ``last_exit_code`` and
    ``last_finished_at`` describe the previous run, if any; ``ready_changed_at`` is when
    ``ready`` last flipped (the Ready condition's lastTransitionTime).
    """

    started_at: str
    ready_changed_at: str
    running: bool
    ready: bool
    restart_count: int = 0
    last_exit_code: int | None = None
    last_finished_at: str | None = None


def timestamp(moment: datetime.datetime | None = None) -> str:
    """Return an RFC 3339 timestamp with second precision, as the API stores them."""
    return (moment or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, status: bool, since: str) -> JsonObject:
    return {"type": kind, "status": "True" if status else "False", "lastTransitionTime": since}


def _container_status(container: JsonObject, seen: Observation) -> JsonObject:
    if seen.running:
        state: JsonObject = {"running": {"startedAt": seen.started_at}}
    else:
        state = {"waiting": {"reason": "CrashLoopBackOff", "message": "process exited"}}
    status: JsonObject = {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "containerID": "",
        "ready": seen.ready,
        "started": seen.running,
        "restartCount": seen.restart_count,
        "state": state,
        "lastState": {},
    }
    if seen.last_exit_code is not None:
        status["lastState"] = {
            "terminated": {
                "exitCode": seen.last_exit_code,
                "reason": "Completed" if seen.last_exit_code == 0 else "Error",
                "finishedAt": seen.last_finished_at,
            }
        }
    return status


def pod_status(pod: JsonObject, seen: Observation) -> JsonObject:
    """Return the full ``status`` of ``pod`` for a merge patch of its status subresource."""
    since = seen.started_at
    return {
        "phase": "Running",
        "hostIP": LOCAL_IP,
        "hostIPs": [{"ip": LOCAL_IP}],
        "podIP": LOCAL_IP,
        "podIPs": [{"ip": LOCAL_IP}],
        "startTime": pod["status"].get("startTime", since),
        "conditions": [
            _condition("PodScheduled", True, since),
            _condition("Initialized", True, since),
            _condition("ContainersReady", seen.ready, seen.ready_changed_at),
            _condition("Ready", seen.ready, seen.ready_changed_at),
        ],
        "containerStatuses": [
            _container_status(container, seen) for container in pod["spec"]["containers"]
        ],
    }
