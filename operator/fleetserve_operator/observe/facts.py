"""Pure: what the cluster reports of the tracks, from their Deployments and pods.

`sync` lists the children and the pods of an InferenceService through `kube` and calls
`track_facts` for the stable and the canary track (`rollout.next_step` reads the result),
`track_fetches` for the tracks whose pods fetch their model (`observe.status` reports
`ModelFetched` and the digest each track serves from it),
and `workload_problem` for every track: what failed after the operator applied its
children (pods that crash at start, images that cannot be pulled, a ReplicaSet that may not
create pods, a rollout past its progress deadline), which `observe.status` reports as `Degraded`.
A pod counts only when it runs the Deployment's current template (same spec-hash label), so
restarts and OOM kills of pods being replaced by a rolling update are not held against the
new template.

`deployment_reading` and `pod_reading` are all that these functions (and `observe.status`)
read of one Deployment's or pod's status, so the child watch can tell an event that changes
what a reconcile would observe from one that changes nothing it reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping

from fleetserve_operator import contract, naming
from fleetserve_operator.errors import bounded
from fleetserve_operator.naming import Track
from fleetserve_operator.observe.status import is_rolled_out, track_status
from fleetserve_operator.records import Manifest, Problem, TrackFetch
from fleetserve_operator.rollout import TrackFacts

__all__ = [
    "CRASH_LOOP",
    "MAX_MESSAGE",
    "OOM_KILLED",
    "STATUS_READINGS",
    "deployment_reading",
    "pod_reading",
    "track_facts",
    "track_fetches",
    "workload_problem",
]

OOM_KILLED = "OOMKilled"
"""The container termination reason the kubelet reports for an out-of-memory kill."""
CRASH_LOOP = "CrashLoopBackOff"
"""The kubelet's waiting reason for a container that keeps exiting."""
MAX_MESSAGE = 512
"""Longest message taken from a pod or Deployment into status (they can carry logs)."""
MAX_DIGEST = 80
"""Longest digest taken from a fetch's record (`sha256:` and 64 hex digits is 71)."""
_FAILING_WAITS = frozenset({
    CRASH_LOOP,
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "PreStartHookError",
    "PostStartHookError",
})  # fmt: skip
"""Waiting reasons of a container that will not start without a change; other waiting
reasons (`ContainerCreating`, `PodInitializing`) are a start in progress."""


def _labels(obj: Manifest) -> Mapping[str, str]:
    labels: Mapping[str, str] = obj["metadata"].get("labels") or {}
    return labels


def _is_oom_killed(container: Manifest) -> bool:
    states = (container.get("state") or {}, container.get("lastState") or {})
    return any((state.get("terminated") or {}).get("reason") == OOM_KILLED for state in states)


def _current_pods(deployment: Manifest, pods: Iterable[Manifest]) -> list[Manifest]:
    """The pods of `deployment`'s track that run its current template."""
    labels = _labels(deployment)
    track, spec_hash = labels.get(naming.TRACK_LABEL), labels.get(naming.SPEC_HASH_LABEL)
    return [
        pod
        for pod in pods
        if _labels(pod).get(naming.TRACK_LABEL) == track
        and _labels(pod).get(naming.SPEC_HASH_LABEL) == spec_hash
    ]


def track_facts(deployment: Manifest | None, pods: Iterable[Manifest]) -> TrackFacts | None:
    """The track's `TrackFacts`; None when it has no Deployment.

    Args:
        deployment: The track's Deployment as observed (labels, spec, status).
        pods: Pods of the InferenceService (any track; they are filtered here).
    """
    if deployment is None:
        return None
    current = _current_pods(deployment, pods)
    containers = [container for pod in current for container in _all_statuses(pod)]
    fetch = next(filter(None, (_fetch_failure(pod) for pod in current)), None)
    return TrackFacts(
        spec_hash=_labels(deployment).get(naming.SPEC_HASH_LABEL),
        available=(deployment.get("status") or {}).get("availableReplicas", 0),
        replicas=deployment["spec"].get("replicas", 0),
        rolled_out=is_rolled_out(deployment),
        restarts=sum(container.get("restartCount", 0) for container in containers),
        oom_killed=any(_is_oom_killed(container) for container in containers),
        fetch_failure=None if fetch is None else (fetch.reason, fetch.message),
    )


def _all_statuses(pod: Manifest) -> list[Manifest]:
    """The statuses of the pod's init containers and containers."""
    status = pod.get("status") or {}
    init: list[Manifest] = status.get("initContainerStatuses") or []
    return init + (status.get("containerStatuses") or [])


def track_fetches(
    deployments: Mapping[Track, Manifest], pods: Iterable[Manifest]
) -> dict[Track, TrackFetch]:
    """How far the current pods of each track that fetches its model have got.

    A track fetches when its pod template has the fetch init container; the others are
    left out. A completed fetch's termination message is its record (`{"digest", "bytes",
    "files"}`), from which the digest it installed is read.
    """
    listed = list(pods)
    fetches: dict[Track, TrackFetch] = {}
    for track, deployment in deployments.items():
        template = deployment["spec"].get("template", {}).get("spec", {})
        init = template.get("initContainers") or []
        if not any(c.get("name") == contract.FETCH_CONTAINER_NAME for c in init):
            continue
        current = _current_pods(deployment, listed)
        done = [record for record in map(_fetched_record, current) if record is not None]
        digests = {_bounded_text(record.get("digest")) for record in done}
        cache = [_bounded_text(record.get("cache")) for record in done]
        fetches[track] = TrackFetch(
            pods=len(current),
            fetched=len(done),
            digests=tuple(sorted(digest for digest in digests if digest)),
            failure=next(filter(None, map(_fetch_failure, current)), None),
            cache=tuple(sorted(outcome for outcome in cache if outcome)),
        )
    return fetches


def _fetch_status(pod: Manifest) -> Manifest:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return next((c for c in statuses if c.get("name") == contract.FETCH_CONTAINER_NAME), {})


def _fetched_record(pod: Manifest) -> Manifest | None:
    """The record the pod's completed fetch wrote; None while it has not completed.

    Empty when it completed without a readable record (an older image).
    """
    ended = (_fetch_status(pod).get("state") or {}).get("terminated") or {}
    if not ended or ended.get("exitCode", 0) != 0:
        return None
    try:
        record = json.loads(str(ended.get("message") or ""))
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _bounded_text(value: object) -> str:
    """A string field of a fetch's record, cut at `MAX_DIGEST`; "" for anything else."""
    return bounded(value, MAX_DIGEST) if isinstance(value, str) else ""


def _fetch_failure(pod: Manifest) -> Problem | None:
    """Why the pod's model fetch failed, in the fetch's own words; None if it has not failed.

    The fetch writes `{"reason": ..., "message": ...}` as its termination message; a run that
    ended otherwise (killed, out of memory) reads as `FETCH_FAILED` with the kubelet's reason.
    While the kubelet backs off, the failed run is the container's `lastState`.
    """
    container = _fetch_status(pod)
    states = (container.get("state") or {}, container.get("lastState") or {})
    for state in states:
        ended = state.get("terminated") or {}
        if ended and ended.get("exitCode", 0) != 0:
            reason, message = _reported(ended)
            where = f"pod {pod['metadata']['name']}: model fetch failed"
            return Problem(reason, bounded(f"{where}: {message}", MAX_MESSAGE))
    return None


def _reported(ended: Manifest) -> tuple[str, str]:
    """(reason, message) of a failed fetch's termination, from its JSON when it wrote one."""
    text = str(ended.get("message") or "")
    try:
        report = json.loads(text)
    except ValueError:
        report = None
    if isinstance(report, dict) and report.get("reason") in set(contract.FetchFailure):
        return str(report["reason"]), str(report.get("message", ""))
    detail = f"exit code {ended.get('exitCode')} ({ended.get('reason', 'Error')})"
    return contract.FETCH_FAILED, f"{detail}: {text}" if text else detail


def _deployment_failure(deployment: Manifest) -> Problem | None:
    """What the Deployment's own conditions say went wrong, if anything.

    `ReplicaFailure` True: its ReplicaSet may not create pods (a missing ServiceAccount, an
    exceeded quota, an admission webhook's refusal). `Progressing` False: the rollout
    missed its progress deadline (`ProgressDeadlineExceeded`), e.g. pods that never become
    ready and never crash.
    """
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        kind, status = condition.get("type"), condition.get("status")
        if (kind, status) in (("ReplicaFailure", "True"), ("Progressing", "False")):
            name = deployment["metadata"]["name"]
            message = f"Deployment {name}: {condition.get('message', '')}"
            return Problem(condition.get("reason") or str(kind), bounded(message, MAX_MESSAGE))
    return None


def _container_failure(pod: Manifest, container: Manifest) -> Problem | None:
    """A container that cannot start or keeps exiting, in the kubelet's own words.

    A crashed container alternates between waiting (`CrashLoopBackOff`) and a new run that
    is not ready yet; both read as `CrashLoopBackOff` (or `OOMKilled`, when that ended the
    last run) with the last run's exit, so status does not flap with the back-off.
    """
    where = f"pod {pod['metadata']['name']} container {container.get('name', '')}"
    waiting = (container.get("state") or {}).get("waiting") or {}
    last = (container.get("lastState") or {}).get("terminated") or {}
    reason = waiting.get("reason", "")
    if reason in _FAILING_WAITS and reason != CRASH_LOOP:
        return Problem(reason, bounded(f"{where}: {waiting.get('message') or reason}", MAX_MESSAGE))
    crashed = (
        container.get("restartCount", 0) > 0
        and not container.get("ready")
        and last.get("exitCode", 0) != 0
    )
    if reason != CRASH_LOOP and not crashed:
        return None
    detail = f"{where} keeps exiting"
    if last:
        detail += f"; its last run exited with code {last.get('exitCode')}"
        detail += f" ({last.get('reason', 'Error')})"
        if last.get("message"):
            detail += f": {last['message']}"
    reason = OOM_KILLED if last.get("reason") == OOM_KILLED else CRASH_LOOP
    return Problem(reason, bounded(detail, MAX_MESSAGE))


def workload_problem(
    deployments: Mapping[Track, Manifest], pods: Iterable[Manifest]
) -> Problem | None:
    """The first failure of the tracks after their children were applied, stable first.

    The reason is the cluster's own (`FailedCreate`, `CrashLoopBackOff`, `ImagePullBackOff`,
    ...) and the message names the Deployment or pod and quotes it, cut at `MAX_MESSAGE`.
    """
    listed = list(pods)
    for track in Track:
        deployment = deployments.get(track)
        if deployment is None:
            continue
        failure = _deployment_failure(deployment)
        if failure is not None:
            return failure
        for pod in _current_pods(deployment, listed):
            fetch = _fetch_failure(pod)
            if fetch is not None:
                return fetch
            for container in (pod.get("status") or {}).get("containerStatuses") or []:
                failure = _container_failure(pod, container)
                if failure is not None:
                    return failure
    return None


def deployment_reading(deployment: Manifest) -> tuple[object, ...]:
    """All a reconcile reads of the Deployment's status: its counts, rollout and failure.

    Two states of a Deployment with the same metadata, spec and reading observe alike, so
    the status updates between them (`unavailableReplicas`, a condition's timestamps or
    reason) are no news to its service.
    """
    return (track_status(deployment), is_rolled_out(deployment), _deployment_failure(deployment))


def pod_reading(pod: Manifest) -> tuple[object, ...]:
    """All a reconcile reads of the pod's status: restarts, kills, failures, its fetch.

    Two states of a pod with the same metadata, spec and reading observe alike, so its
    conditions, its start and its readiness are no news to its service (readiness reaches
    it through the Deployment's counts); a crash, an image that cannot be pulled or a
    finished fetch are.
    """
    main: list[Manifest] = (pod.get("status") or {}).get("containerStatuses") or []
    every = _all_statuses(pod)
    return (
        sum(container.get("restartCount", 0) for container in every),
        any(_is_oom_killed(container) for container in every),
        tuple(filter(None, (_container_failure(pod, container) for container in main))),
        _fetch_failure(pod),
        _fetched_record(pod),
    )


STATUS_READINGS: Mapping[str, Callable[[Manifest], object]] = {
    "Deployment": deployment_reading,
    "Pod": pod_reading,
}
"""What a reconcile reads of each kind's status, by kind; of any other kind, nothing."""
