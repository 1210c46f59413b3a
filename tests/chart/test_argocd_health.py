"""deploy/argocd/inferenceservice-health.lua, run by a real Lua interpreter (lupa) on samples.

Argo CD runs a health script with the live object as the global `obj` and reads the table it
returns; the samples use the phases and conditions of `fleetserve_operator.spec.status`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetserve_operator.spec import ConditionType, RolloutPhase

lupa = pytest.importorskip("lupa", reason="pip install -r requirements/ship.txt (lupa)")

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "argocd" / "inferenceservice-health.lua"
Manifest = dict[str, Any]


def health(obj: Manifest) -> tuple[str, str]:
    """Run the script as Argo CD does and return (status, message)."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT.read_text())
    return str(result["status"]), str(result["message"])


def condition(kind: ConditionType, status: str, reason: str, message: str = "") -> Manifest:
    """A metav1.Condition as the operator writes it."""
    return {
        "type": kind.value,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def service(
    phase: RolloutPhase | None,
    *conditions: Manifest,
    generation: int = 2,
    observed: int = 2,
    **status: Any,
) -> Manifest:
    """An InferenceService with the given phase, conditions and other status fields."""
    obj: Manifest = {
        "apiVersion": "serving.fleetserve.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "minilm", "namespace": "ml", "generation": generation},
        "spec": {"model": {"name": "minilm"}},
    }
    if phase is not None:
        obj["status"] = {
            "phase": phase.value,
            "observedGeneration": observed,
            "conditions": list(conditions),
            **status,
        }
    return obj


READY = condition(ConditionType.READY, "True", "Succeeded")


@pytest.mark.parametrize(
    ("obj", "expected", "in_message"),
    [
        pytest.param(service(None), "Progressing", "Waiting", id="no-status"),
        pytest.param(
            service(RolloutPhase.SUCCEEDED, READY, stableVersion="v1", ready="2/2"),
            "Healthy",
            "v1 (2/2)",
            id="ready",
        ),
        pytest.param(
            service(RolloutPhase.SUCCEEDED, READY, generation=3, observed=2),
            "Progressing",
            "generation 3",
            id="stale-status",
        ),
        pytest.param(
            service(RolloutPhase.SUCCEEDED, condition(ConditionType.READY, "False", "Pending")),
            "Progressing",
            "Succeeded",
            id="succeeded-not-ready",
        ),
        pytest.param(service(RolloutPhase.PENDING), "Progressing", "Pending", id="pending"),
        pytest.param(service(RolloutPhase.STARTING), "Progressing", "Starting", id="starting"),
        pytest.param(
            service(RolloutPhase.PROGRESSING, READY, canaryVersion="v2", canaryWeight=20),
            "Progressing",
            "canary v2 at 20%",
            id="rollout-step",
        ),
        pytest.param(
            service(RolloutPhase.HOLDING, READY, rollout={"message": "Prometheus down"}),
            "Progressing",
            "Prometheus down",
            id="holding",
        ),
        pytest.param(service(RolloutPhase.PROMOTING, READY), "Progressing", "", id="promoting"),
        pytest.param(
            service(RolloutPhase.PAUSED, READY, canaryWeight=5),
            "Suspended",
            "weight 5%",
            id="paused",
        ),
        pytest.param(
            service(
                RolloutPhase.BAKING,
                READY,
                canaryVersion="v2",
                canaryWeight=100,
                rollout={
                    "bake": {"since": "2026-01-01T00:00:00Z", "until": "2026-01-01T01:00:00Z"}
                },
            ),
            "Progressing",
            "canary v2 at 100%",
            id="baking",
        ),
        pytest.param(
            service(
                RolloutPhase.BAKING,
                READY,
                canaryVersion="v2",
                rollout={
                    "bake": {
                        "since": "2026-01-01T00:00:00Z",
                        "until": "2026-01-01T01:00:00Z",
                        "paused": True,
                    }
                },
            ),
            "Suspended",
            "Bake paused: version v2",
            id="bake-paused",
        ),
        pytest.param(
            service(
                RolloutPhase.ROLLED_BACK,
                READY,
                rollout={"message": "error_ratio 0.31 > 0.05"},
            ),
            "Degraded",
            "RolledBack: error_ratio 0.31 > 0.05",
            id="rolled-back",
        ),
        pytest.param(
            service(RolloutPhase.FAILED, lastError="canary never became Ready"),
            "Degraded",
            "Failed: canary never became Ready",
            id="failed",
        ),
        pytest.param(
            service(
                RolloutPhase.SUCCEEDED,
                READY,
                condition(ConditionType.DEGRADED, "True", "MemoryBudget", "batch does not fit"),
            ),
            "Degraded",
            "batch does not fit",
            id="degraded-condition",
        ),
        pytest.param(
            service(
                RolloutPhase.SUCCEEDED,
                READY,
                condition(ConditionType.DEGRADED, "False", "Healthy"),
            ),
            "Healthy",
            "",
            id="degraded-false",
        ),
        pytest.param(
            service(
                RolloutPhase.SUCCEEDED,
                condition(ConditionType.FALLBACK_ACTIVE, "True", "NoGpuReplica"),
            ),
            "Degraded",
            "CPU fallback",
            id="fallback-active",
        ),
    ],
)
def test_health(obj: Manifest, expected: str, in_message: str) -> None:
    """Each sample status maps to the Argo CD health docs/how-to/install-with-helm.md promises."""
    status, message = health(obj)
    assert (status, in_message in message) == (expected, True), message


def test_every_phase_has_a_known_health() -> None:
    """No RolloutPhase falls through to Unknown."""
    for phase in RolloutPhase:
        status, message = health(service(phase, READY))
        assert status in {"Healthy", "Progressing", "Suspended", "Degraded"}, message
