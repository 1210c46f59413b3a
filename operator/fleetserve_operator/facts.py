"""Pure: what the rollout needs to know of a GPU track, from its Deployment and pods.

`sync` lists the children and the pods of an InferenceService through `kube` and calls
`track_facts` for the stable and the canary track; `rollout.next_step` reads the result.
A pod counts only when it runs the Deployment's current template (same spec-hash label), so
restarts and OOM kills of pods being replaced by a rolling update are not held against the
new template.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleetserve_operator import naming
from fleetserve_operator.observe import is_rolled_out
from fleetserve_operator.rollout import TrackFacts

__all__ = ["OOM_KILLED", "track_facts"]

Manifest = dict[str, Any]
OOM_KILLED = "OOMKilled"
"""The container termination reason the kubelet reports for an out-of-memory kill."""


def _labels(obj: Manifest) -> Mapping[str, str]:
    labels: Mapping[str, str] = obj["metadata"].get("labels") or {}
    return labels


def _is_oom_killed(container: Manifest) -> bool:
    states = (container.get("state") or {}, container.get("lastState") or {})
    return any((state.get("terminated") or {}).get("reason") == OOM_KILLED for state in states)


def track_facts(deployment: Manifest | None, pods: Iterable[Manifest]) -> TrackFacts | None:
    """The track's `TrackFacts`; None when it has no Deployment.

    Args:
        deployment: The track's Deployment as observed (labels, spec, status).
        pods: Pods of the InferenceService (any track; they are filtered here).
    """
    if deployment is None:
        return None
    labels = _labels(deployment)
    track, spec_hash = labels.get(naming.TRACK_LABEL), labels.get(naming.SPEC_HASH_LABEL)
    containers = [
        container
        for pod in pods
        if _labels(pod).get(naming.TRACK_LABEL) == track
        and _labels(pod).get(naming.SPEC_HASH_LABEL) == spec_hash
        for container in (pod.get("status") or {}).get("containerStatuses") or []
    ]
    return TrackFacts(
        spec_hash=spec_hash,
        available=(deployment.get("status") or {}).get("availableReplicas", 0),
        replicas=deployment["spec"].get("replicas", 0),
        rolled_out=is_rolled_out(deployment),
        restarts=sum(container.get("restartCount", 0) for container in containers),
        oom_killed=any(_is_oom_killed(container) for container in containers),
    )
