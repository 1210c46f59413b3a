"""A restarted operator resumes without duplicating objects or writing anything.

The writes are counted twice: by the new operator's own `fleetserve_operator_writes` counter,
and by the resourceVersions of the InferenceService and every object it owns, which any write
(even a no-op server-side apply that touched managedFields) would change.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetserve_e2e import KubeClient
from fleetserve_e2e.operator_process import OperatorProcess, fsvc_path
from fleetserve_e2e.operator_testing import children, synthetic_service, wait_converged
from fleetserve_e2e.testing import list_pods
from fleetserve_e2e.waiting import wait_until

NAME = "demo"


def _versions(kube: KubeClient, namespace: str) -> dict[tuple[str, str], str]:
    """ResourceVersion of the InferenceService, its children and their ReplicaSets."""
    found = {
        key: obj["metadata"]["resourceVersion"]
        for key, obj in children(kube, namespace, NAME).items()
    }
    service = kube.get(fsvc_path(namespace, NAME))
    found[("InferenceService", NAME)] = service["metadata"]["resourceVersion"]
    for replica_set in kube.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets")["items"]:
        found[("ReplicaSet", replica_set["metadata"]["name"])] = replica_set["metadata"][
            "resourceVersion"
        ]
    return found


def _caught_up(operator: OperatorProcess) -> bool:
    resumed = any(
        dict(labels).get("trigger") == "resume"
        for labels in operator.counters("fleetserve_operator_reconciles")
    )
    idle = (
        operator.gauge("fleetserve_operator_work_queue_depth") == 0
        and operator.gauge("fleetserve_operator_reconciles_in_flight") == 0
    )
    return resumed and idle


def test_restart_writes_nothing(
    kube: KubeClient, namespace: str, start_operator: Callable[[], OperatorProcess]
) -> None:
    """After a restart: the same objects, unchanged resourceVersions, zero writes counted."""
    first = start_operator()
    kube.create(fsvc_path(namespace), synthetic_service(NAME))
    wait_converged(kube, namespace, NAME, ready={"stable": 1})
    before = _versions(kube, namespace)
    pods = {p["metadata"]["uid"] for p in list_pods(kube, namespace)}
    first.stop()

    second = start_operator()
    # The new operator reconciles the service on resume, and again for the children its
    # watches list; those listings queue it in the resync lane, where they may merge with the
    # resume and with each other. Caught up: the resume reconciled and nothing queued or running.
    wait_until(lambda: _caught_up(second), timeout_s=30.0, what="the restarted operator's resume")
    assert second.total("fleetserve_operator_writes") == 0
    assert _versions(kube, namespace) == before
    assert {p["metadata"]["uid"] for p in list_pods(kube, namespace)} == pods
