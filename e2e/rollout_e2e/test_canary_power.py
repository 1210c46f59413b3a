"""Power against real runtimes and a real Prometheus: a clearly worse version never reaches 100%.

Stable fails 1% of its requests. The analysis runs at its defaults (sequential,
`minDetectableRatio` 2, `power` 0.9, `maxErrorRate` 0.01), on the harness's 4 s steps at
20/50/100% (`fleetserve_e2e.rollout_testing`), `LoadDriver` at 100 requests/s and
`progressDeadline` 3m. The 50% step leads to 100%, so it passes only once the evidence rules
out twice stable's odds of an error (and of a slow answer): a version failing 3% is rolled
back (by a test, or at its deadline), never promoted; a version as good as stable is held
until the evidence is in, then promoted. Each test prints what decided it.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_e2e.loadgen import LoadDriver
from fleetserve_e2e.rollout_testing import (
    NAME,
    STEPS,
    RolloutEnv,
    assert_promoted_once,
    deploy,
    event_reasons,
    roll_out,
    service_status,
    synthetic_model,
)
from fleetserve_e2e.waiting import wait_until

RATE_RPS = 100.0
DECISION_S = 300.0
"""Long enough for the 3m deadline after the 50% step's interval, and the steps before it."""
# A rollback at the deadline comes after the steps before it and the 3m hold.
pytestmark = pytest.mark.timeout(DECISION_S + 120)
DEFAULTS = {"minDetectableRatio": 2.0, "power": 0.9}
"""The defaults, restated over the harness's faster setting for tests of other things."""
STABLE_ERRORS = 0.01


def _deploy(env: RolloutEnv) -> None:
    model = synthetic_model("1", error_rate=STABLE_ERRORS)
    deploy(env, "sequential", model, analysis=DEFAULTS, progress_deadline="3m")


def _decided(env: RolloutEnv) -> dict[str, Any]:
    """Wait until the rollout of version 2 is promoted or rolled back; its status."""

    def decided() -> dict[str, Any] | None:
        status = service_status(env)
        promoted = status.get("stableVersion") == "2" and status.get("phase") == "Succeeded"
        return status if promoted or status.get("phase") == "RolledBack" else None

    return wait_until(decided, timeout_s=DECISION_S, what="version 2 promoted or rolled back")


def _canary_errors(load: LoadDriver) -> str:
    records = load.by_track("canary")
    failed = sum(r.is_server_error for r in records)
    return f"canary_requests={len(records)} canary_errors={failed}"


def test_a_version_failing_three_times_as_often_is_rolled_back_never_promoted(
    env: RolloutEnv,
) -> None:
    """1% → 3% errors: rolled back, and the canary never had 100% of the traffic."""
    operator = env.start_operator()
    _deploy(env)
    with LoadDriver(env.cluster, env.namespace, NAME, NAME, rate_rps=RATE_RPS,
                    duration_s=DECISION_S) as load:  # fmt: skip
        roll_out(env, synthetic_model("2", error_rate=3 * STABLE_ERRORS, seed=1))
        status = _decided(env)
        load.wait_canary_gone()
    message = status["rollout"]["message"]
    print(f"\n{message}\n{_canary_errors(load)}")
    assert status["phase"] == "RolledBack", message
    assert status["stableVersion"] == "1"
    seen = [sample.weights.get("canary", 0) for sample in load.routes]
    assert 100 not in seen, seen
    assert operator.total("fleetserve_operator_promotions") == 0
    assert "Promoted" not in event_reasons(env)
    assert message.startswith(("AnalysisRejected", "ProgressDeadlineExceeded")), message


def test_a_version_as_good_as_stable_is_held_for_evidence_then_promoted(env: RolloutEnv) -> None:
    """Both versions fail 1%: every step passes, the last gated one once its gates cleared."""
    operator = env.start_operator()
    _deploy(env)
    with LoadDriver(env.cluster, env.namespace, NAME, NAME, rate_rps=RATE_RPS,
                    duration_s=DECISION_S) as load:  # fmt: skip
        roll_out(env, synthetic_model("2", error_rate=STABLE_ERRORS, seed=1))
        status = _decided(env)
        load.wait_canary_gone()
    assert status["phase"] == "Succeeded", status["rollout"]["message"]
    assert load.canary_steps() == STEPS
    assert_promoted_once(operator)
    gates = {
        check["name"]: check["power"]
        for check in status["rollout"]["evidence"]["checks"]
        if "power" in check
    }
    assert set(gates) == {"error-rate-vs-stable", "latency-vs-stable"}
    assert all(gate["cleared"] for gate in gates.values()), gates
    held = "HoldingForEvidence" in event_reasons(env)
    needed = {name: gate.get("samplesNeeded") for name, gate in gates.items()}
    print(f"\nheld_for_evidence={held} samples_needed_last={needed}\n{_canary_errors(load)}")
