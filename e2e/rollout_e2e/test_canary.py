"""Progressive delivery against real runtimes and a real Prometheus: what the analysis decides.

Each test runs the operator under its RBAC role with a 0.5 s rollout timer, one synthetic
runtime process per track, 4 s steps (8 s for the sequential-mode rollback) judged on a 4 s
window (`fleetserve_e2e.rollout_testing`), and `LoadDriver` playing the gateway by the
HTTPRoute's weights. The two erroring-version tests print `time_to_rollback_s=`: from the
first request the canary answered with a 5xx to the route's canary weight 0, in threshold and
in sequential mode; the sequential one also prints `intervals=` (that time / the interval).
Prometheus scrapes every second here, so sequential mode sees a new increment each second.
The generative tests roll out the synthetic generative model under `StreamingLoadDriver`'s
streamed completions, in 8 s steps, judged on errors, time to first token and inter-token
latency; the slower-per-token one prints `itl_rollback_after_s=`, from the canary's first
stream to its weight 0. Rollouts through outages (stable pods, operator, Prometheus) are
test_canary_outages.py's.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_e2e.genload import StreamingLoadDriver
from fleetserve_e2e.loadgen import LoadDriver
from fleetserve_e2e.operator_process import (
    TRACK_LABEL,
    OperatorProcess,
    child_path,
    condition,
    fsvc_path,
    get_or_none,
)
from fleetserve_e2e.rollout_testing import (
    BASE_LATENCY_MS,
    NAME,
    ROLLOUT_S,
    STEPS,
    RolloutEnv,
    assert_promoted_once,
    deploy,
    failed_requests,
    roll_out,
    route_weights,
    stable_status,
    synthetic_model,
    wait_event_reasons,
    wait_phase,
)
from fleetserve_e2e.waiting import wait_until

PER_TOKEN_MS = 4
PREFILL_MS_PER_TOKEN = 8
CHAT_INTERVAL_S = 8.0
"""The ITL test weighs a stream as one answer: 8 s steps give it ~30 canary streams at 20%."""
CHAT_TRAFFIC = {"hostnames": ["chat.fleetserve.test"]}
"""A generative service's OpenAI routes carry no model name: its HTTPRoute needs a host."""
SEQUENTIAL_INTERVAL_S = 8.0
"""The sequential-mode rollback's interval. Sequential mode's time to reject does not grow with
the interval (a scrape, a 0.5 s look, a patch, a route poll); threshold mode's does. 4 s steps
left too little room on two loaded cores (4.6 s measured once), 8 s still tells the two modes
apart."""
# The operator's per-InferenceService gauges (docs/reference/metrics.md, "Operator metrics").
PHASE = "fleetserve_operator_inferenceservice_phase"
CANARY_WEIGHT = "fleetserve_operator_canary_weight_percent"


def _chat_model(version: str, per_token_ms: float) -> dict[str, str]:
    """The synthetic generative model taking `per_token_ms` per step.

    Its prefill is long enough that a few ms more per step hardly move the time to first
    token: a regression per token shows in the inter-token latency, not in TTFT.
    """
    query = f"per_token_ms={per_token_ms:g}&prefill_ms_per_token={PREFILL_MS_PER_TOKEN:g}"
    return {"name": NAME, "version": version, "uri": f"builtin://synthetic-generate?{query}"}


def _gauge(operator: OperatorProcess, name: str, namespace: str, **labels: str) -> float | None:
    """The operator's sample of gauge `name` for this test's InferenceService, if exported."""
    text = httpx.get(operator.metrics_url, timeout=5.0, trust_env=False).text
    wanted = {"namespace": namespace, "name": NAME, **labels}
    samples = (s for f in text_string_to_metric_families(text) for s in f.samples)
    return next((s.value for s in samples if s.name == name and s.labels == wanted), None)


def _wait_gauge(
    operator: OperatorProcess, name: str, namespace: str, value: float | None, **labels: str
) -> None:
    """Wait for the value (the operator exports status right after writing it)."""
    wait_until(
        lambda: _gauge(operator, name, namespace, **labels) == value,
        timeout_s=30.0,
        what=f"{name}{labels or ''} to read {value}",
    )


def _rolled_back(env: RolloutEnv, operator: OperatorProcess, load: LoadDriver) -> dict[str, Any]:
    status = wait_phase(env, "RolledBack", ROLLOUT_S)
    assert status["stableVersion"] == "1"
    assert status.get("canaryWeight", 0) == 0
    wait_until(
        lambda: (
            get_or_none(env.kube, child_path("Deployment", env.namespace, f"{NAME}-canary")) is None
        ),
        timeout_s=30.0,
        what="the canary Deployment to go",
    )
    assert route_weights(env) == {"stable": 100}
    load.wait_canary_gone()
    # Counted as the transition's side effect, just after the status write.
    wait_until(
        lambda: operator.total("fleetserve_operator_rollbacks") == 1,
        timeout_s=30.0,
        what="one rollback counted",
    )
    _wait_gauge(operator, PHASE, env.namespace, 1.0, phase="RolledBack")
    assert _gauge(operator, CANARY_WEIGHT, env.namespace) == 0
    wait_event_reasons(env, "RolledBack")
    assert all(r.status == 200 for r in load.by_track("stable")), "stable answered errors"
    return status


@pytest.mark.parametrize("mode", ["threshold", "sequential"])
def test_healthy_version_is_promoted_step_by_step(
    env: RolloutEnv,
    mode: str,
) -> None:
    """Version 2, as good as version 1, passes every step, is promoted and is stable.

    In sequential mode every passed analysis shows each test's e-value under its 1/α (the
    tests against stable and the `maxErrorRate` test: α/4 each, with the 100% baseline's share).
    """
    operator = env.start_operator()
    deploy(env, mode)
    gauged: set[float | None] = set()

    def promoted() -> dict[str, Any] | None:
        gauged.add(_gauge(operator, CANARY_WEIGHT, env.namespace))
        return stable_status(env, "2")

    with LoadDriver(env.cluster, env.namespace, NAME, NAME) as load:
        roll_out(env, synthetic_model("2"))
        status = wait_until(promoted, timeout_s=ROLLOUT_S, what="version 2 to become stable")
        load.wait_canary_gone()
    assert load.canary_steps() == STEPS, load.routes
    assert route_weights(env) == {"stable": 100}
    passed = [a for a in status["rollout"]["analyses"] if a["verdict"] == "Passed"]
    assert len(passed) >= len(STEPS)
    assert_promoted_once(operator)
    assert condition(status, "Promoted")["status"] == "True"
    stepped = {w for w in gauged if w}
    assert stepped, f"the canary weight gauge showed no step: {gauged}"
    assert stepped <= set(STEPS), gauged
    _wait_gauge(operator, CANARY_WEIGHT, env.namespace, 0.0)
    _wait_gauge(operator, PHASE, env.namespace, 1.0, phase="Succeeded")
    assert load.by_track("canary"), "no request reached the canary"
    failures = failed_requests(load)
    assert not failures, failures
    if mode == "sequential":
        for result in passed:
            tests = [c for c in result["checks"] if "eValue" in c]
            names = {c["name"] for c in tests}
            assert names == {"error-rate-vs-stable", "latency-vs-stable", "error-rate"}
            assert all(c["eValue"] < c["threshold"] == 400 for c in tests), result
        evidence = status["rollout"]["evidence"]
        assert all(c["samples"] > 0 and not c.get("rejected") for c in evidence["checks"])


def test_erroring_version_is_rolled_back_at_once(env: RolloutEnv) -> None:
    """20% errors: rolled back at once; only canary-routed requests saw errors.

    Deleting the InferenceService afterwards drops the operator's gauges of it.
    """
    operator = env.start_operator()
    deploy(env)
    with LoadDriver(env.cluster, env.namespace, NAME, NAME) as load:
        roll_out(env, synthetic_model("2", error_rate=0.2))
        status = _rolled_back(env, operator, load)
    env.kube.delete(fsvc_path(env.namespace, NAME))
    wait_until(
        lambda: _gauge(operator, PHASE, env.namespace, phase="RolledBack") is None,
        timeout_s=60.0,
        what="the deleted InferenceService's gauges to go",
    )
    assert _gauge(operator, CANARY_WEIGHT, env.namespace) is None
    assert "error-rate" in status["rollout"]["message"]
    bad = [r for r in load.records if r.is_server_error]
    assert bad, "the canary answered no error"
    assert {r.track for r in bad} == {"canary"}
    first_bad = min(r.time for r in bad)
    withdrawn = load.canary_gone_after(first_bad)
    assert withdrawn is not None, load.routes
    print(f"\nthreshold mode: time_to_rollback_s={withdrawn - first_bad:.2f}")


def test_sequential_mode_rolls_an_erroring_version_back_within_one_interval(
    env: RolloutEnv,
) -> None:
    """20% errors, sequential mode: weight 0 within one interval of the first error.

    An error test (against stable, or of `maxErrorRate`) rejects at the look after its e-value
    crosses 1/α; the Event `AnalysisRejected` and the evidence in status say so.
    """
    operator = env.start_operator()
    deploy(env, "sequential", interval_s=SEQUENTIAL_INTERVAL_S)
    # The test needs a few canary errors to reject: 100 requests/s make them come in ~1 s.
    with LoadDriver(env.cluster, env.namespace, NAME, NAME, rate_rps=100.0) as load:
        roll_out(env, synthetic_model("2", error_rate=0.2))
        status = _rolled_back(env, operator, load)
    message = status["rollout"]["message"]
    assert "error-rate" in message, message
    assert "e-value" in message, message
    wait_event_reasons(env, "AnalysisRejected")
    rejected = [c for c in status["rollout"]["evidence"]["checks"] if c.get("rejected")]
    assert rejected, status["rollout"]["evidence"]
    assert all(c["name"].startswith("error-rate") for c in rejected), rejected
    assert all(c["eValue"] >= c["threshold"] for c in rejected), rejected
    bad = [r for r in load.records if r.is_server_error]
    assert {r.track for r in bad} == {"canary"}
    first_bad = min(r.time for r in bad)
    withdrawn = load.canary_gone_after(first_bad)
    assert withdrawn is not None, load.routes
    elapsed = withdrawn - first_bad
    # On lines of their own: `make e2e-rollout` greps the last time_to_rollback_s.
    print(f"\ntime_to_rollback_s={elapsed:.2f}\nintervals={elapsed / SEQUENTIAL_INTERVAL_S:.2f}")
    assert elapsed <= SEQUENTIAL_INTERVAL_S


def test_fresh_canarys_first_error_is_counted_by_increase(env: RolloutEnv) -> None:
    """The canary's 5xx series exist at 0 before its first error, so increase() sees it.

    A series born at 1 on the first error would read an increase of 0 in every window.
    """
    env.start_operator()
    deploy(env)
    roll_out(env, synthetic_model("2", error_rate=1.0))
    pod = wait_until(
        lambda: next(
            (p for p in env.cluster.pod_addresses()
             if p.namespace == env.namespace and p.labels.get(TRACK_LABEL) == "canary" and p.ready),
            None,
        ),
        timeout_s=90.0,
        what="a ready canary pod",
    )  # fmt: skip
    canary = f'namespace="{env.namespace}",track="canary",version="2"'
    wait_until(
        lambda: env.prometheus.query(f"fleetserve_model_load_seconds{{{canary}}}") or None,
        timeout_s=30.0,
        what="Prometheus to scrape the loaded canary",
    )
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}
    answer = httpx.post(f"{pod.url}/v2/models/{NAME}/infer", json=body, timeout=10.0,
                        trust_env=False)  # fmt: skip
    assert answer.status_code == 500
    errors = f'sum(increase(fleetserve_requests_total{{{canary},code=~"5.."}}[1m]))'

    def counted() -> float | None:
        result = env.prometheus.query(errors)
        value = float(result[0]["value"][1]) if result else 0.0
        return value if value >= 1.0 else None

    assert wait_until(counted, timeout_s=15.0, what="the first error in increase()") >= 1.0


@pytest.mark.parametrize(
    ("mode", "check"),
    [("threshold", "p99-latency-vs-stable"), ("sequential", "latency-vs-stable e-value")],
)
def test_slow_version_is_rolled_back_on_latency(
    env: RolloutEnv,
    mode: str,
    check: str,
) -> None:
    """3x latency, no errors: the p99-vs-stable check, or the latency test, rolls it back."""
    operator = env.start_operator()
    deploy(env, mode)
    with LoadDriver(env.cluster, env.namespace, NAME, NAME) as load:
        roll_out(env, synthetic_model("2", latency_ms=3 * BASE_LATENCY_MS))
        status = _rolled_back(env, operator, load)
    assert check in status["rollout"]["message"]
    assert not [r for r in load.records if r.is_server_error]


def test_good_generative_version_is_promoted_on_its_token_latencies(env: RolloutEnv) -> None:
    """Streamed completions: version 2, as fast per token as 1, is promoted to 100%.

    Sequential mode judges it on errors, time to first token and inter-token latency against
    stable (no request-latency test) and on its own error rate and p99 bounds (tests, at α/7
    each); the preemption bound is a window; every step counted tokens as well as requests.
    """
    env.start_operator()
    deploy(env, "sequential", _chat_model("1", PER_TOKEN_MS),
           CHAT_INTERVAL_S, traffic=CHAT_TRAFFIC)  # fmt: skip
    with StreamingLoadDriver(env.cluster, env.namespace, NAME, NAME) as load:
        roll_out(env, _chat_model("2", PER_TOKEN_MS))
        status = wait_until(
            lambda: stable_status(env, "2"), timeout_s=ROLLOUT_S, what="version 2 to become stable"
        )
        load.wait_canary_gone()
    assert load.canary_steps() == STEPS
    assert all(r.status == 200 for r in load.records), "a stream failed"
    passed = [a for a in status["rollout"]["analyses"] if a["verdict"] == "Passed"]
    assert len(passed) >= len(STEPS)
    for result in passed:
        tests = {c["name"]: c for c in result["checks"] if "eValue" in c}
        against_stable = {"error-rate-vs-stable", "ttft-vs-stable", "itl-vs-stable"}
        assert set(tests) == against_stable | {"error-rate", "ttft-p99", "itl-p99"}
        assert all(c["eValue"] < c["threshold"] == 700 for c in tests.values()), result
        assert result["tokens"] >= 50, result
        windows = {c["name"] for c in result["checks"] if "eValue" not in c}
        assert windows == {"preemption-rate"}, result
    itl = next(c for c in status["rollout"]["evidence"]["checks"] if c["name"] == "itl-vs-stable")
    print(f"\nitl_e_value={itl['eValue']} token_gaps={itl['samples']:.0f}")


def test_generative_version_slower_per_token_is_rolled_back_on_itl(env: RolloutEnv) -> None:
    """Version 2 takes 4x longer per token: the inter-token latency test rolls it back.

    The streams it served all succeeded; status names the ITL test and its e-value.
    """
    operator = env.start_operator()
    deploy(env, "sequential", _chat_model("1", PER_TOKEN_MS),
           CHAT_INTERVAL_S, traffic=CHAT_TRAFFIC)  # fmt: skip
    with StreamingLoadDriver(env.cluster, env.namespace, NAME, NAME) as load:
        roll_out(env, _chat_model("2", 4 * PER_TOKEN_MS))
        status = _rolled_back(env, operator, load)
    message = status["rollout"]["message"]
    assert "itl-vs-stable e-value" in message, message
    wait_event_reasons(env, "AnalysisRejected")
    checks = {c["name"]: c for c in status["rollout"]["evidence"]["checks"]}
    assert checks["itl-vs-stable"]["rejected"] is True
    assert checks["itl-vs-stable"]["eValue"] >= checks["itl-vs-stable"]["threshold"]
    assert load.by_track("canary"), "no stream reached the canary"
    assert all(r.status == 200 for r in load.records), "a stream failed"
    first = min(r.time for r in load.by_track("canary"))
    withdrawn = load.canary_gone_after(first)
    assert withdrawn is not None, load.routes
    print(
        f"\n{message}\nitl_rollback_after_s={withdrawn - first:.2f} (from the first canary stream)"
    )
