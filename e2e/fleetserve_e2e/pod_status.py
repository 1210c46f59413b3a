"""Build the pod status a kubelet would report, from what the harness observed (pure).

The status carries the fields controllers and users read: phase, the PodScheduled /
Initialized / ContainersReady / Ready conditions, podIP (127.0.0.1, or the pod's own loopback
address where the cluster gives pods one), hostIP 127.0.0.1, and one containerStatus per
container with ``ready``, ``started``, ``restartCount``, ``state`` and ``lastState``; with
init containers (the container backend runs them) the pod is Pending until they all completed,
and ``initContainerStatuses`` says how each one ran.
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
    ``ready`` last flipped (the Ready condition's lastTransitionTime).  ``last_reason`` is the
    previous run's termination reason when the runner knows it (``OOMKilled``); else it follows
    from the exit code.  ``initialized`` is False while init containers run, whose statuses
    are ``init_statuses``.
    """

    started_at: str
    ready_changed_at: str
    running: bool
    ready: bool
    restart_count: int = 0
    last_exit_code: int | None = None
    last_finished_at: str | None = None
    last_reason: str | None = None
    initialized: bool = True
    init_statuses: tuple[JsonObject, ...] = ()
    waiting: tuple[str, str] | None = None
    """(reason, message) of containers that cannot be created as the spec says, e.g.
    ``CreateContainerConfigError`` for a Secret that does not exist; the pod stays Pending."""


def timestamp(moment: datetime.datetime | None = None) -> str:
    """Return an RFC 3339 timestamp with second precision, as the API stores them."""
    return (moment or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, status: bool, since: str) -> JsonObject:
    return {"type": kind, "status": "True" if status else "False", "lastTransitionTime": since}


def _container_status(container: JsonObject, seen: Observation) -> JsonObject:
    if seen.waiting is not None:
        reason, message = seen.waiting
        state: JsonObject = {"waiting": {"reason": reason, "message": message}}
    elif not seen.initialized:
        state = {"waiting": {"reason": "PodInitializing"}}
    elif seen.running:
        state = {"running": {"startedAt": seen.started_at}}
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
                "reason": seen.last_reason or termination_reason(seen.last_exit_code),
                "finishedAt": seen.last_finished_at,
            }
        }
    return status


def termination_reason(exit_code: int) -> str:
    """The kubelet's reason for a container that exited on its own."""
    return "Completed" if exit_code == 0 else "Error"


def pod_status(pod: JsonObject, seen: Observation, *, pod_ip: str = LOCAL_IP) -> JsonObject:
    """Return the full ``status`` of ``pod`` for a merge patch of its status subresource.

    `pod_ip` is where the pod listens; the host (every fake node) is 127.0.0.1.
    """
    since = seen.started_at
    created = seen.waiting is None
    status: JsonObject = {
        "phase": "Running" if seen.initialized and created else "Pending",
        "hostIP": LOCAL_IP,
        "hostIPs": [{"ip": LOCAL_IP}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": pod["status"].get("startTime", since),
        "conditions": [
            _condition("PodScheduled", True, since),
            _condition("Initialized", seen.initialized, since),
            _condition("ContainersReady", seen.ready, seen.ready_changed_at),
            _condition("Ready", seen.ready, seen.ready_changed_at),
        ],
        "containerStatuses": [
            _container_status(container, seen) for container in pod["spec"]["containers"]
        ],
    }
    if seen.init_statuses:
        status["initContainerStatuses"] = list(seen.init_statuses)
    return status
