"""The shadow stage against real runtimes and a real Prometheus, before the first step.

Version 1 serves with `rollout.shadow` set, so its pod follows the `demo-shadow` ConfigMap
(`--shadow-file`). Version 2's canary comes up at weight 0; the operator writes the canary
Service's URL into the ConfigMap, the stable pod starts copying every request to it (the
fake kubelet projects the ConfigMap into a file and resolves the Service to the canary's
pod: `fleetserve_e2e.pod_volumes`), and the operator judges the agreement Prometheus
scrapes from the stable pod.

- A version whose vectors have another width (`dim=16`) disagrees on every answer: rolled
  back at the shadow stage, its reason naming the measured agreement, and no caller saw it:
  every request of the load was answered 200, by stable.
- A version that answers alike (only slower) is shown to agree and takes the first step.
"""

from __future__ import annotations

import json

from fleetserve_e2e.kubeapi import JsonObject, namespaced
from fleetserve_e2e.loadgen import NO_ANSWER, LoadDriver
from fleetserve_e2e.rollout_testing import (
    NAME,
    STEPS,
    RolloutEnv,
    deploy,
    failed_requests,
    roll_out,
    route_weights,
    service_status,
    synthetic_model,
    wait_event_reasons,
    wait_phase,
)
from fleetserve_e2e.waiting import wait_until

SHADOW: JsonObject = {
    "fraction": 1.0,
    "minCompared": 20,
    "minAgreement": 0.9,
    "maxErrorRate": 0.1,
    "maxDuration": "90s",
}
RATE_RPS = 30.0


def _target(env: RolloutEnv) -> JsonObject | None:
    found = env.kube.get(namespaced("configmaps", env.namespace, f"{NAME}-shadow"))
    text = found.get("data", {}).get("target.json", "")
    return json.loads(text) if text else None


def test_a_disagreeing_version_is_rolled_back_at_the_shadow_stage(env: RolloutEnv) -> None:
    """Another width of vectors: rolled back before any caller saw it, naming the agreement."""
    operator = env.start_operator()
    deploy(env, "sequential", rollout={"shadow": SHADOW})
    assert _target(env) is None
    with LoadDriver(env.cluster, env.namespace, NAME, NAME, rate_rps=RATE_RPS) as load:
        roll_out(env, synthetic_model("2", dim=16))
        shadowing = wait_phase(env, "Shadowing", 90.0)
        assert shadowing["canaryWeight"] == 0
        # The phase is written ahead of the children it asks for (the ConfigMap among them).
        target = wait_until(lambda: _target(env), timeout_s=15.0, what="the shadow target")
        assert target["url"] == f"http://{NAME}-canary.{env.namespace}.svc:80", target
        assert target["version_label"] == "2"
        assert route_weights(env).get("canary", 0) == 0
        status = wait_phase(env, "RolledBack", 120.0)
    message = status["rollout"]["message"]
    print(f"\nrolled back: {message}")
    assert message.startswith("ShadowFailed: version 2 withdrawn at 0%"), message
    assert "agreement 0 (0 of" in message, message
    wait_event_reasons(env, "ShadowStarted")
    assert _target(env) is None
    assert "shadow" not in status["rollout"]
    # Counted after the status write that rolled back.
    wait_until(lambda: operator.total("fleetserve_operator_rollbacks") == 1, timeout_s=10.0,
               what="the rollback's counter")  # fmt: skip
    # No caller saw version 2: every request was answered, 200, by stable.
    assert not failed_requests(load), failed_requests(load)
    assert {r.track for r in load.records} == {"stable"}
    assert not [r for r in load.records if r.status == NO_ANSWER]


def test_an_agreeing_version_passes_the_shadow_stage_to_the_first_step(env: RolloutEnv) -> None:
    """The same answers, slower: shown to agree, the canary takes the first step."""
    env.start_operator()
    deploy(env, "sequential", rollout={"shadow": SHADOW})
    with LoadDriver(env.cluster, env.namespace, NAME, NAME, rate_rps=RATE_RPS) as load:
        roll_out(env, synthetic_model("2", per_item_ms=1))
        wait_phase(env, "Shadowing", 90.0)

        def first_step() -> JsonObject | None:
            status = service_status(env)
            return status if status.get("canaryWeight") == STEPS[0] else None

        status = wait_until(first_step, timeout_s=120.0, what="the first step")
    wait_event_reasons(env, "ShadowPassed")
    assert "shadow" not in status["rollout"]
    assert _target(env) is None
    passed = [a for a in status["rollout"]["analyses"] if a["verdict"] == "Passed"]
    assert passed, status["rollout"]
    assert not failed_requests(load), failed_requests(load)
