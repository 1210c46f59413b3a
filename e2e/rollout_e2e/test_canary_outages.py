"""A canary rollout through outages: the stable pods, the operator, Prometheus.

As in test_canary.py, the operator runs under its RBAC role with a 0.5 s rollout timer, one
synthetic runtime process per track, 4 s steps judged on a 4 s window
(`fleetserve_e2e.rollout_testing`), and `LoadDriver` plays the gateway. Killing the stable
pods' processes moves traffic to the CPU fallback and back; an operator killed mid-rollout is
followed by one that resumes the same step; Prometheus frozen at a step holds the step, and
nothing is passed on old evidence.
"""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetserve_e2e.loadgen import LoadDriver
from fleetserve_e2e.operator_process import (
    TRACK_LABEL,
    condition,
)
from fleetserve_e2e.rollout_testing import (
    NAME,
    ROLLOUT_S,
    STEPS,
    RolloutEnv,
    deploy,
    event_reasons,
    failed_requests,
    roll_out,
    route_weights,
    service_status,
    synthetic_model,
    wait_event_reasons,
    wait_phase,
)
from fleetserve_e2e.waiting import wait_until

FROZEN_S = 60.0
"""The longest Prometheus outage: the first analysis recorded in it ends it, several intervals
later."""
FROZEN_MARGIN_S = 2.0
"""A look that read Prometheus just before the freeze may still be recorded this long after."""


def test_stable_outage_fails_over_to_cpu_and_back(env: RolloutEnv) -> None:
    """Killing the stable pods' processes moves traffic to the fallback, then back."""
    env.start_operator()
    fallback = {"enabled": True, "threads": 1, "replicas": {"min": 1, "max": 1}}
    deploy(env, fallback=fallback)
    wait_until(
        lambda: service_status(env)["tracks"].get("fallback", {}).get("readyReplicas") == 1,
        timeout_s=60.0,
        what="the fallback to be ready",
    )
    with LoadDriver(env.cluster, env.namespace, NAME, NAME) as load:
        wait_until(lambda: load.by_track("stable"), timeout_s=30.0, what="load on stable")
        for pod in env.cluster.pod_addresses():
            if pod.namespace == env.namespace and pod.labels.get(TRACK_LABEL) == "stable":
                os.kill(pod.pid, signal.SIGKILL)
        wait_until(
            lambda: condition(service_status(env), "FallbackActive")["status"] == "True",
            timeout_s=30.0,
            what="FallbackActive",
        )
        wait_until(
            lambda: condition(service_status(env), "FallbackActive")["status"] == "False",
            timeout_s=90.0,
            what="traffic back on the GPU track",
        )
        wait_until(lambda: load.weights == {"stable": 100, "fallback": 0}, timeout_s=10.0,
                   what="the route back on stable")  # fmt: skip
    assert {"stable": 0, "fallback": 100} in [sample.weights for sample in load.routes]
    served = [r for r in load.by_track("fallback") if r.status == 200]
    assert served, "the fallback served nothing"
    wait_event_reasons(env, "FallbackActivated", "FallbackDeactivated")


def test_restarted_operator_resumes_the_same_step(env: RolloutEnv) -> None:
    """Killed at step 2 of 3: the next operator goes on from there and promotes once."""
    first = env.start_operator()
    deploy(env)
    with LoadDriver(env.cluster, env.namespace, NAME, NAME):
        roll_out(env, synthetic_model("2"))
        at_kill = wait_until(
            lambda: (s := service_status(env)).get("rollout", {}).get("stepIndex") == 1 and s,
            timeout_s=ROLLOUT_S,
            what="step 2",
        )
        first.kill()
        second = env.start_operator()
        seen: list[dict[str, Any]] = []

        def promoted() -> bool:
            seen.append(service_status(env))
            return seen[-1].get("stableVersion") == "2"

        try:
            wait_until(promoted, timeout_s=ROLLOUT_S, what="version 2 to become stable")
        except TimeoutError as exc:
            # What the restarted operator saw and did is the diagnosis; the timeout alone is not.
            last = seen[-1] if seen else {}
            detail = f"last status: {last}\nsecond operator's log (tail):\n{second.log()[-4000:]}"
            raise AssertionError(f"{exc}\n{detail}") from exc
    started = at_kill["rollout"]["canaryStartedAt"]
    active = [s for s in seen if s.get("canaryVersion")]
    assert all(s["rollout"].get("canaryStartedAt") == started for s in active), "restarted"
    assert all(s["rollout"].get("stepIndex", 1) >= 1 for s in active), "went back a step"
    # The counter and the Event are applied after the status write that promoted: wait for
    # them (a scrape right after that write can come first), then check there was only one.
    wait_until(
        lambda: (
            second.total("fleetserve_operator_promotions") >= 1 and "Promoted" in event_reasons(env)
        ),
        timeout_s=30.0,
        what="the promotion's counter and Event",
    )
    assert second.total("fleetserve_operator_promotions") == 1
    reasons = event_reasons(env)
    assert reasons.count("Promoted") == 1
    assert reasons.count("RolloutStarted") == 1
    assert "RolloutRestarted" not in reasons


def test_frozen_prometheus_holds_the_step_and_never_passes_it(env: RolloutEnv) -> None:
    """The real Prometheus stopped (SIGSTOP: it accepts and never answers) at a step.

    While it is frozen the canary stays at its weight and no analysis recorded then is a pass:
    evidence gathered before the outage must not carry a step. Once it answers again the
    good version is promoted.
    """
    env.start_operator()
    deploy(env, "sequential")
    assert env.prometheus.process is not None
    pid = env.prometheus.process.pid
    with LoadDriver(env.cluster, env.namespace, NAME, NAME) as load:
        roll_out(env, synthetic_model("2"))
        wait_until(
            lambda: service_status(env).get("canaryWeight") == STEPS[0],
            timeout_s=60.0,
            what=f"the canary at {STEPS[0]} %",
        )
        os.kill(pid, signal.SIGSTOP)
        frozen_at = datetime.now(UTC)

        def recorded_in_outage() -> list[dict[str, Any]] | None:
            since = frozen_at + timedelta(seconds=FROZEN_MARGIN_S)
            analyses = service_status(env)["rollout"].get("analyses", [])
            late = [a for a in analyses if datetime.fromisoformat(a["time"]) >= since]
            return late or None

        try:
            # A look at a frozen Prometheus waits out its query timeouts (5 s each, several
            # queries), so the first analysis of the outage comes some seconds after the freeze.
            during = wait_until(
                recorded_in_outage, timeout_s=FROZEN_S, what="an analysis during the outage"
            )
            status = service_status(env)
            weights = route_weights(env)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert status.get("canaryWeight") == STEPS[0], status
        assert weights == {"stable": 100 - STEPS[0], "canary": STEPS[0]}
        assert all(a["verdict"] == "Inconclusive" for a in during), during
        wait_phase(env, "Succeeded", ROLLOUT_S)
    assert service_status(env)["stableVersion"] == "2"
    failures = failed_requests(load)
    assert not failures, failures
