"""What fails after the operator applied its children reaches status and Events.

A runtime that rejects its configuration or cannot load its model crash-loops (the harness
restarts it, as a kubelet would); a ReplicaSet whose ServiceAccount does not exist cannot
create pods. Either way the InferenceService says so: Ready False and Degraded True with the
cluster's own reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_e2e import KubeClient
from fleetserve_e2e.operator_process import OperatorProcess, fsvc_path
from fleetserve_e2e.operator_testing import synthetic_service, wait_condition, warning_events
from fleetserve_e2e.waiting import wait_until

NAME = "demo"


def _assert_reported(kube: KubeClient, namespace: str, reason: str, quoted: str) -> None:
    """Degraded and Ready name `reason`, the message quotes `quoted`, an Event says it too."""
    degraded = wait_condition(kube, namespace, NAME, "Degraded", reason=reason, timeout_s=90.0)
    assert quoted in degraded["message"]
    ready = wait_condition(kube, namespace, NAME, "Ready", status="False", reason=reason)
    assert ready["message"] == degraded["message"]
    # The Event is the transition's side effect, posted just after the status write.
    events = wait_until(
        lambda: [e for e in warning_events(kube, namespace, NAME) if e["reason"] == reason] or None,
        timeout_s=30.0,
        what=f"a {reason} Event",
    )
    assert quoted in events[0]["message"]


CPU_RUNTIME = {"replicas": {"min": 1, "max": 1}, "device": "cpu", "threads": 1}
SHOUT = [{"name": "FLEETSERVE_LOG_LEVEL", "value": "shout"}]


@pytest.mark.parametrize(
    "sections",
    [
        pytest.param(
            {"runtime": {**CPU_RUNTIME, "env": SHOUT}},
            id="bad-runtime-setting",
        ),
        pytest.param(
            {"model": {"name": NAME, "version": "1", "uri": "builtin://synthetic?dim=wide"}},
            id="model-cannot-load",
        ),
    ],
)
def test_a_runtime_that_exits_at_start_is_crash_looping(
    kube: KubeClient, namespace: str, operator: OperatorProcess, sections: dict[str, Any]
) -> None:
    """A runtime that stops at start (a bad setting, a model it cannot load) crash-loops."""
    kube.create(fsvc_path(namespace), synthetic_service(NAME, **sections))
    _assert_reported(kube, namespace, "CrashLoopBackOff", "container runtime keeps exiting")


def test_a_missing_service_account_is_a_failed_create(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """The ReplicaSet may not create pods for a ServiceAccount that does not exist."""
    runtime = {**CPU_RUNTIME, "serviceAccountName": "gpu-runner"}
    kube.create(fsvc_path(namespace), synthetic_service(NAME, runtime=runtime))
    _assert_reported(kube, namespace, "FailedCreate", 'serviceaccount "gpu-runner" not found')
    status = kube.get(fsvc_path(namespace, NAME))["status"]
    assert 'serviceaccount "gpu-runner" not found' in status["lastError"]
