"""Killed between a step's two writes, the operator never moves traffic backwards.

A step writes the InferenceService's status and the HTTPRoute's weights. The first operator
runs `crashing_operator.py`, which SIGKILLs it right after whichever of the two writes of the
50% step comes first. Then Prometheus goes away (the service's analysis now points at a port
nothing listens on, which the next operator is allowed to query), so the restarted operator
cannot judge the step and holds where status says the rollout is. A watch on the HTTPRoute
records every version of it from the kill on: the canary's weight may only rise, and ends
where status says.

A hand edit of the route cannot stand in for the crash: the operator rightly restores a
route edited by hand to what status says, forwards or backwards. Only a crash between the
two writes shows which of them the operator makes first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.loadgen import canary_weight
from fleetserve_e2e.operator_process import OperatorProcess, child_path, fsvc_path, fsvc_status
from fleetserve_e2e.operator_testing import synthetic_service
from fleetserve_e2e.paths import REPO_DIR
from fleetserve_e2e.ports import free_port
from fleetserve_e2e.testing import assert_operator_log_clean, watch_history
from fleetserve_e2e.waiting import wait_until

NAME = "demo"
STEP = 50
CRASHING = [
    str(REPO_DIR / ".venv" / "bin" / "python"),
    str(Path(__file__).with_name("crashing_operator.py")),
    "run",
]
TICK = {"FLEETSERVE_ROLLOUT_TICK_S": "0.5"}


def test_traffic_never_moves_back_after_a_crash_between_the_writes(
    kube: KubeClient,
    namespace: str,
    local_cluster: LocalCluster,
    operator_kubeconfig: Path,
    tmp_path: Path,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """Route and status agree again after the restart, and the canary's weight only rose."""
    first = OperatorProcess.start(
        kubeconfig=operator_kubeconfig,
        namespace=namespace,
        log_path=tmp_path / "crashing-operator.log",
        marker=local_cluster.marker,
        settings={**TICK, "E2E_CRASH_AT_CANARY_WEIGHT": str(STEP)},
        command=CRASHING,
    )
    try:
        rollout = {"steps": [20, STEP, 100], "interval": "2s", "progressDeadline": "2m"}
        traffic = {"provider": "gateway-api", "parentRefs": [{"name": "gateway"}]}
        kube.create(fsvc_path(namespace), synthetic_service(NAME, traffic=traffic, rollout=rollout))
        wait_until(lambda: fsvc_status(kube, namespace, NAME).get("phase") == "Succeeded",
                   timeout_s=90.0, what="version 1 to serve")  # fmt: skip
        model = {"name": NAME, "version": "2", "uri": "builtin://synthetic?latency_ms=1"}
        kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"model": model}})
        wait_until(lambda: not first.process.is_running(), timeout_s=90.0,
                   what=f"the operator to crash at the {STEP}% step")  # fmt: skip
    finally:
        first.stop()
    assert_operator_log_clean(first.log(), "the crashing operator's log")

    at_crash = fsvc_status(kube, namespace, NAME)
    prometheus = f"http://127.0.0.1:{free_port()}"  # nothing listens: Prometheus is down
    analysis = {"prometheusUrl": prometheus, "window": "2s", "inconclusiveThreshold": 1}
    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"rollout": {"analysis": analysis}}})
    route = kube.get(child_path("HTTPRoute", namespace, NAME))
    with watch_history(
        local_cluster,
        child_path("HTTPRoute", namespace),
        route,
        lambda manifest: canary_weight(manifest, NAME),
    ) as weights:
        assert max(weights[0], at_crash["canaryWeight"]) == STEP, "not killed at the step"
        start_operator({**TICK, "FLEETSERVE_PROMETHEUS_URL": prometheus})

        def judged_without_data() -> dict[str, Any] | None:
            status = fsvc_status(kube, namespace, NAME)
            analyses = status.get("rollout", {}).get("analyses", [])
            held = analyses and analyses[-1].get("reason") == "PrometheusDown"
            return status if held and weights[-1] == status["canaryWeight"] else None

        try:
            status = wait_until(judged_without_data, timeout_s=60.0, what="a step held")
        except TimeoutError:
            pytest.fail(f"route weights {weights}, status {fsvc_status(kube, namespace, NAME)}")
    assert status["canaryWeight"] >= at_crash["canaryWeight"]
    assert weights == sorted(weights), f"the canary's weight went back: {weights}"
    assert weights[-1] == status["canaryWeight"] == STEP
