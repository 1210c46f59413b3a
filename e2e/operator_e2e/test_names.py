"""Names at their limits: the longest legal InferenceService name runs on every track.

Every child's name derives from the InferenceService's (`<name>-stable`, `-canary`,
`-fallback`, and from those the ReplicaSets, pods and EndpointSlices the cluster's
controllers name), so the CRD's bound on `metadata.name` must leave room for all of them.
"""

from __future__ import annotations

import pytest

from fleetserve_e2e import KubeApiError, KubeClient, LocalCluster
from fleetserve_e2e.operator_process import TRACK_LABEL, OperatorProcess, fsvc_path
from fleetserve_e2e.operator_testing import synthetic_service, wait_converged
from fleetserve_e2e.testing import wait_for_ready_pods
from fleetserve_e2e.waiting import wait_until

LONGEST = 54
"""The CRD's bound on metadata.name: 63 (a Service name) minus len("-fallback")."""


def _create(kube: KubeClient, namespace: str, name: str, *, dry_run: bool = False) -> None:
    params = {"dryRun": "All"} if dry_run else None
    kube.request("POST", fsvc_path(namespace), body=synthetic_service(name), params=params)


def test_the_longest_name_is_accepted_and_one_more_refused(
    crd: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    """The API server takes LONGEST characters and refuses LONGEST + 1, naming the field."""
    _create(kube, namespace, "n" * LONGEST, dry_run=True)
    with pytest.raises(KubeApiError) as refused:
        _create(kube, namespace, "n" * (LONGEST + 1), dry_run=True)
    assert refused.value.status_code == 422
    assert "metadata.name" in refused.value.message


def test_the_longest_name_runs_stable_canary_and_fallback(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """A LONGEST-character service gets ready pods on all three tracks at once."""
    name = "n" * LONGEST
    manifest = synthetic_service(
        name,
        fallback={"enabled": True, "threads": 1},
        # The canary holds its first step for the whole test.
        rollout={"steps": [50, 100], "interval": "10m"},
    )
    kube.create(fsvc_path(namespace), manifest)
    wait_converged(kube, namespace, name, ready={"stable": 1, "fallback": 1})

    model = {**manifest["spec"]["model"], "version": "2"}
    kube.merge_patch(fsvc_path(namespace, name), {"spec": {"model": model}})
    wait_until(
        lambda: kube.get(fsvc_path(namespace, name))["status"].get("phase") == "Progressing",
        timeout_s=90.0,
        what="the canary ready at its first step",
    )
    pods = wait_for_ready_pods(kube, namespace, count=3, timeout_s=60.0)
    tracks = sorted(pod["metadata"]["labels"][TRACK_LABEL] for pod in pods)
    assert tracks == ["canary", "fallback", "stable"]
