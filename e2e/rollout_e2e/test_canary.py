"""Progressive delivery against real runtimes and a real Prometheus.

Each test runs the operator under its RBAC role with a 0.5 s rollout timer, one synthetic
runtime process per track, 4 s steps (8 s in (b2)) judged on a 4 s window, and `LoadDriver`
playing the gateway by the HTTPRoute's weights. (b) and (b2) print `time_to_rollback_s=`:
from the first request the canary answered with a 5xx to the route's canary weight 0, in
threshold and in sequential mode; (b2) also prints `intervals=` (that time / the interval).
Prometheus scrapes every second here, so sequential mode sees a new increment each second.
(f) and (g) roll out the synthetic generative model under `StreamingLoadDriver`'s streamed
completions, in 8 s steps, judged on errors, time to first token and inter-token latency;
(g) prints `itl_rollback_after_s=`, from the canary's first stream to its weight 0. (h)
freezes the real Prometheus at a step: the step holds, nothing is passed on old evidence.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_e2e import KubeClient, LocalCluster, LocalPrometheus
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
from fleetserve_e2e.operator_testing import synthetic_service
from fleetserve_e2e.waiting import wait_until

NAME = "demo"
BASE_LATENCY_MS = 20
PER_TOKEN_MS = 4
PREFILL_MS_PER_TOKEN = 8
CHAT_INTERVAL_S = 8.0
"""The ITL test weighs a stream as one answer: 8 s steps give it ~30 canary streams at 20%."""
CHAT_TRAFFIC = {"hostnames": ["chat.fleetserve.test"]}
"""A generative service's OpenAI routes carry no model name: its HTTPRoute needs a host."""
STEPS = [20, 50, 100]
INTERVAL_S = 4.0
ROLLOUT_S = 120.0
SEQUENTIAL_INTERVAL_S = 8.0
"""(b2)'s interval. Sequential mode's time to reject does not grow with the interval (a scrape,
a 0.5 s look, a patch, a route poll); threshold mode's does. 4 s steps left too little room on
two loaded cores (4.6 s measured once), 8 s still tells the two modes apart."""
FROZEN_S = 60.0
"""(h)'s longest outage: the first analysis recorded in it ends it, several intervals later."""
FROZEN_MARGIN_S = 2.0
"""A look that read Prometheus just before the freeze may still be recorded this long after."""
# The operator's per-InferenceService gauges (docs/reference/metrics.md, "Operator metrics").
PHASE = "fleetserve_operator_inferenceservice_phase"
CANARY_WEIGHT = "fleetserve_operator_canary_weight_percent"


def _service(
    prometheus: LocalPrometheus,
    mode: str = "threshold",
    model: dict[str, str] | None = None,
    interval_s: float = INTERVAL_S,
    **sections: Any,
) -> dict[str, Any]:
    """One synthetic replica, gateway-api traffic, 4 s steps analysed on 4 s of metrics."""
    analysis = {
        "mode": mode,
        "prometheusUrl": prometheus.url,
        "window": "4s",
        "minRequests": 5,
        "failureThreshold": 1,
        # Tail latencies of 1-replica tracks on two busy cores are noisy: 2x, not 1.5x.
        "maxLatencyRatioVsStable": 2.0,
        "maxQueueWaitRatioVsStable": 10.0,
        # A generative canary's 5 streams of 16 tokens.
        "minTokens": 50,
    }
    return synthetic_service(
        NAME,
        model=model or _model("1"),
        traffic={
            "provider": "gateway-api",
            "parentRefs": [{"name": "gateway"}],
            **sections.pop("traffic", {}),
        },
        rollout={
            "steps": STEPS,
            "interval": f"{interval_s:g}s",
            "progressDeadline": "2m",
            "analysis": analysis,
        },
        **sections,
    )


def _model(version: str, **params: float) -> dict[str, str]:
    query = "&".join(f"{k}={v}" for k, v in {"latency_ms": BASE_LATENCY_MS, **params}.items())
    return {"name": NAME, "version": version, "uri": f"builtin://synthetic?{query}"}


def _chat_model(version: str, per_token_ms: float) -> dict[str, str]:
    """The synthetic generative model taking `per_token_ms` per step.

    Its prefill is long enough that a few ms more per step hardly move the time to first
    token: a regression per token shows in the inter-token latency, not in TTFT.
    """
    query = f"per_token_ms={per_token_ms:g}&prefill_ms_per_token={PREFILL_MS_PER_TOKEN:g}"
    return {"name": NAME, "version": version, "uri": f"builtin://synthetic-generate?{query}"}


def _status(kube: KubeClient, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = kube.get(fsvc_path(namespace, NAME)).get("status", {})
    return status


def _wait_phase(kube: KubeClient, namespace: str, phase: str, timeout_s: float) -> dict[str, Any]:
    return wait_until(
        lambda: (s := _status(kube, namespace)).get("phase") == phase and s,
        timeout_s=timeout_s,
        what=f"phase {phase}",
    )


def _deploy(
    kube: KubeClient,
    namespace: str,
    prometheus: LocalPrometheus,
    mode: str = "threshold",
    model: dict[str, str] | None = None,
    interval_s: float = INTERVAL_S,
    **sections: Any,
) -> dict[str, Any]:
    kube.create(fsvc_path(namespace), _service(prometheus, mode, model, interval_s, **sections))
    return wait_until(
        lambda: (
            (s := _status(kube, namespace)).get("stableVersion") == "1"
            and s.get("phase") == "Succeeded"
            and s
        ),
        timeout_s=90.0,
        what="version 1 to serve",
    )


def _roll_out(kube: KubeClient, namespace: str, model: dict[str, str]) -> None:
    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"model": model}})


def _events(kube: KubeClient, namespace: str) -> list[str]:
    items = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e["reason"] for e in items if e["involvedObject"]["name"] == NAME]


def _route_weights(kube: KubeClient, namespace: str) -> dict[str, int]:
    route = kube.get(child_path("HTTPRoute", namespace, NAME))
    refs = route["spec"]["rules"][0]["backendRefs"]
    return {ref["name"].removeprefix(f"{NAME}-"): ref["weight"] for ref in refs}


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


def _rolled_back(
    kube: KubeClient,
    namespace: str,
    operator: OperatorProcess,
    load: LoadDriver,
) -> dict[str, Any]:
    status = _wait_phase(kube, namespace, "RolledBack", ROLLOUT_S)
    assert status["stableVersion"] == "1"
    assert status.get("canaryWeight", 0) == 0
    wait_until(
        lambda: get_or_none(kube, child_path("Deployment", namespace, f"{NAME}-canary")) is None,
        timeout_s=30.0,
        what="the canary Deployment to go",
    )
    assert _route_weights(kube, namespace) == {"stable": 100}
    # Status is written before the route (write-ahead), and the driver polls the route: wait
    # until it has seen the canary withdrawn, or its samples may end before that change.
    wait_until(
        lambda: not load.weights.get("canary"),
        timeout_s=30.0,
        what="the load driver to see the canary withdrawn",
    )
    # Counted as the transition's side effect, just after the status write.
    wait_until(
        lambda: operator.total("fleetserve_operator_rollbacks") == 1,
        timeout_s=30.0,
        what="one rollback counted",
    )
    _wait_gauge(operator, PHASE, namespace, 1.0, phase="RolledBack")
    assert _gauge(operator, CANARY_WEIGHT, namespace) == 0
    assert "RolledBack" in _events(kube, namespace)
    assert all(r.status == 200 for r in load.by_track("stable")), "stable answered errors"
    return status


@pytest.mark.parametrize("mode", ["threshold", "sequential"])
def test_a_healthy_version_is_promoted(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
    mode: str,
) -> None:
    """(a) Version 2, as good as version 1, passes every step, is promoted and is stable.

    In sequential mode every passed analysis shows each test's e-value under its 1/α.
    """
    operator = rollout_operator()
    _deploy(kube, namespace, local_prometheus, mode)
    gauged: set[float | None] = set()

    def promoted() -> dict[str, Any] | None:
        gauged.add(_gauge(operator, CANARY_WEIGHT, namespace))
        status = _status(kube, namespace)
        done = status.get("stableVersion") == "2" and status.get("phase") == "Succeeded"
        return status if done else None

    with LoadDriver(local_cluster, namespace, NAME, NAME) as load:
        _roll_out(kube, namespace, _model("2"))
        status = wait_until(promoted, timeout_s=ROLLOUT_S, what="version 2 to become stable")
        # Status leads the route (write-ahead): let the driver see the promoted route too.
        wait_until(
            lambda: not load.weights.get("canary"),
            timeout_s=30.0,
            what="the load driver to see the promoted route",
        )
    canary_weights = [sample.weights.get("canary") for sample in load.routes]
    assert [w for w in canary_weights if w] == STEPS, load.routes
    assert _route_weights(kube, namespace) == {"stable": 100}
    passed = [a for a in status["rollout"]["analyses"] if a["verdict"] == "Passed"]
    assert len(passed) >= len(STEPS)
    assert operator.total("fleetserve_operator_promotions") == 1
    assert condition(status, "Promoted")["status"] == "True"
    stepped = {w for w in gauged if w}
    assert stepped, f"the canary weight gauge showed no step: {gauged}"
    assert stepped <= set(STEPS), gauged
    _wait_gauge(operator, CANARY_WEIGHT, namespace, 0.0)
    _wait_gauge(operator, PHASE, namespace, 1.0, phase="Succeeded")
    assert load.by_track("canary"), "no request reached the canary"
    assert all(r.status == 200 for r in load.records), "a request failed"
    if mode == "sequential":
        for result in passed:
            tests = [c for c in result["checks"] if "eValue" in c]
            assert {c["name"] for c in tests} == {"error-rate-vs-stable", "latency-vs-stable"}
            assert all(c["eValue"] < c["threshold"] == 200 for c in tests), result
        evidence = status["rollout"]["evidence"]
        assert all(c["samples"] > 0 and not c.get("rejected") for c in evidence["checks"])


def test_b_an_erroring_version_is_rolled_back(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> None:
    """(b) 20% errors: rolled back at once; only canary-routed requests saw errors.

    Deleting the InferenceService afterwards drops the operator's gauges of it.
    """
    operator = rollout_operator()
    _deploy(kube, namespace, local_prometheus)
    with LoadDriver(local_cluster, namespace, NAME, NAME) as load:
        _roll_out(kube, namespace, _model("2", error_rate=0.2))
        status = _rolled_back(kube, namespace, operator, load)
    kube.delete(fsvc_path(namespace, NAME))
    wait_until(
        lambda: _gauge(operator, PHASE, namespace, phase="RolledBack") is None,
        timeout_s=60.0,
        what="the deleted InferenceService's gauges to go",
    )
    assert _gauge(operator, CANARY_WEIGHT, namespace) is None
    assert "error-rate" in status["rollout"]["message"]
    bad = [r for r in load.records if r.is_server_error]
    assert bad, "the canary answered no error"
    assert {r.track for r in bad} == {"canary"}
    first_bad = min(r.time for r in bad)
    withdrawn = next(
        s.time for s in load.routes if s.time > first_bad and not s.weights.get("canary")
    )
    print(f"\nthreshold mode: time_to_rollback_s={withdrawn - first_bad:.2f}")


def test_b2_sequential_mode_rolls_an_erroring_version_back_within_one_interval(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> None:
    """(b2) 20% errors, sequential mode: weight 0 within one interval of the first error.

    The error test rejects at the look after its e-value crosses 1/α; the Event
    `AnalysisRejected` and the evidence in status say so.
    """
    operator = rollout_operator()
    _deploy(kube, namespace, local_prometheus, "sequential", interval_s=SEQUENTIAL_INTERVAL_S)
    # The test needs a few canary errors to reject: 100 requests/s make them come in ~1 s.
    with LoadDriver(local_cluster, namespace, NAME, NAME, rate_rps=100.0) as load:
        _roll_out(kube, namespace, _model("2", error_rate=0.2))
        status = _rolled_back(kube, namespace, operator, load)
    assert "error-rate-vs-stable e-value" in status["rollout"]["message"]
    assert "AnalysisRejected" in _events(kube, namespace)
    checks = {c["name"]: c for c in status["rollout"]["evidence"]["checks"]}
    assert checks["error-rate-vs-stable"]["rejected"] is True
    assert checks["error-rate-vs-stable"]["eValue"] >= checks["error-rate-vs-stable"]["threshold"]
    bad = [r for r in load.records if r.is_server_error]
    assert {r.track for r in bad} == {"canary"}
    first_bad = min(r.time for r in bad)
    withdrawn = next(
        s.time for s in load.routes if s.time > first_bad and not s.weights.get("canary")
    )
    elapsed = withdrawn - first_bad
    # On lines of their own: `make e2e-rollout` greps the last time_to_rollback_s.
    print(f"\ntime_to_rollback_s={elapsed:.2f}\nintervals={elapsed / SEQUENTIAL_INTERVAL_S:.2f}")
    assert elapsed <= SEQUENTIAL_INTERVAL_S


def test_b3_a_fresh_canarys_first_error_is_counted_by_increase(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> None:
    """(b3) The canary's 5xx series exist at 0 before its first error, so increase() sees it.

    A series born at 1 on the first error would read an increase of 0 in every window.
    """
    rollout_operator()
    _deploy(kube, namespace, local_prometheus)
    _roll_out(kube, namespace, _model("2", error_rate=1.0))
    pod = wait_until(
        lambda: next(
            (p for p in local_cluster.pod_addresses()
             if p.namespace == namespace and p.labels.get(TRACK_LABEL) == "canary" and p.ready),
            None,
        ),
        timeout_s=90.0,
        what="a ready canary pod",
    )  # fmt: skip
    canary = f'namespace="{namespace}",track="canary",version="2"'
    wait_until(
        lambda: local_prometheus.query(f"fleetserve_model_load_seconds{{{canary}}}") or None,
        timeout_s=30.0,
        what="Prometheus to scrape the loaded canary",
    )
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}
    answer = httpx.post(f"{pod.url}/v2/models/{NAME}/infer", json=body, timeout=10.0,
                        trust_env=False)  # fmt: skip
    assert answer.status_code == 500
    errors = f'sum(increase(fleetserve_requests_total{{{canary},code=~"5.."}}[1m]))'

    def counted() -> float | None:
        result = local_prometheus.query(errors)
        value = float(result[0]["value"][1]) if result else 0.0
        return value if value >= 1.0 else None

    assert wait_until(counted, timeout_s=15.0, what="the first error in increase()") >= 1.0


@pytest.mark.parametrize(
    ("mode", "check"),
    [("threshold", "p99-latency-vs-stable"), ("sequential", "latency-vs-stable e-value")],
)
def test_c_a_slow_version_is_rolled_back(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
    mode: str,
    check: str,
) -> None:
    """(c) 3x latency, no errors: the p99-vs-stable check, or the latency test, rolls it back."""
    operator = rollout_operator()
    _deploy(kube, namespace, local_prometheus, mode)
    with LoadDriver(local_cluster, namespace, NAME, NAME) as load:
        _roll_out(kube, namespace, _model("2", latency_ms=3 * BASE_LATENCY_MS))
        status = _rolled_back(kube, namespace, operator, load)
    assert check in status["rollout"]["message"]
    assert not [r for r in load.records if r.is_server_error]


def test_d_stable_outage_fails_over_to_cpu_and_back(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> None:
    """(d) Killing the stable pods' processes moves traffic to the fallback, then back."""
    rollout_operator()
    fallback = {"enabled": True, "threads": 1, "replicas": {"min": 1, "max": 1}}
    _deploy(kube, namespace, local_prometheus, fallback=fallback)
    wait_until(
        lambda: _status(kube, namespace)["tracks"].get("fallback", {}).get("readyReplicas") == 1,
        timeout_s=60.0,
        what="the fallback to be ready",
    )
    with LoadDriver(local_cluster, namespace, NAME, NAME) as load:
        wait_until(lambda: load.by_track("stable"), timeout_s=30.0, what="load on stable")
        for pod in local_cluster.pod_addresses():
            if pod.namespace == namespace and pod.labels.get(TRACK_LABEL) == "stable":
                os.kill(pod.pid, signal.SIGKILL)
        wait_until(
            lambda: condition(_status(kube, namespace), "FallbackActive")["status"] == "True",
            timeout_s=30.0,
            what="FallbackActive",
        )
        wait_until(
            lambda: condition(_status(kube, namespace), "FallbackActive")["status"] == "False",
            timeout_s=90.0,
            what="traffic back on the GPU track",
        )
        wait_until(lambda: load.weights == {"stable": 100, "fallback": 0}, timeout_s=10.0,
                   what="the route back on stable")  # fmt: skip
    assert {"stable": 0, "fallback": 100} in [sample.weights for sample in load.routes]
    served = [r for r in load.by_track("fallback") if r.status == 200]
    assert served, "the fallback served nothing"
    assert {"FallbackActivated", "FallbackDeactivated"} <= set(_events(kube, namespace))


def test_e_a_restarted_operator_resumes_the_same_step(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> None:
    """(e) Killed at step 2 of 3: the next operator goes on from there and promotes once."""
    first = rollout_operator()
    _deploy(kube, namespace, local_prometheus)
    with LoadDriver(local_cluster, namespace, NAME, NAME):
        _roll_out(kube, namespace, _model("2"))
        at_kill = wait_until(
            lambda: (s := _status(kube, namespace)).get("rollout", {}).get("stepIndex") == 1 and s,
            timeout_s=ROLLOUT_S,
            what="step 2",
        )
        first.kill()
        second = rollout_operator()
        seen: list[dict[str, Any]] = []

        def promoted() -> bool:
            seen.append(_status(kube, namespace))
            return seen[-1].get("stableVersion") == "2"

        wait_until(promoted, timeout_s=ROLLOUT_S, what="version 2 to become stable")
    started = at_kill["rollout"]["canaryStartedAt"]
    active = [s for s in seen if s.get("canaryVersion")]
    assert all(s["rollout"].get("canaryStartedAt") == started for s in active), "restarted"
    assert all(s["rollout"].get("stepIndex", 1) >= 1 for s in active), "went back a step"
    assert second.total("fleetserve_operator_promotions") == 1
    reasons = _events(kube, namespace)
    assert reasons.count("Promoted") == 1
    assert reasons.count("RolloutStarted") == 1
    assert "RolloutRestarted" not in reasons


def test_f_a_good_generative_version_is_promoted_on_its_token_latencies(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> None:
    """(f) Streamed completions: version 2, as fast per token as 1, is promoted to 100%.

    Sequential mode judges it on errors, time to first token and inter-token latency
    (no request-latency test), and every step counted tokens as well as requests.
    """
    rollout_operator()
    _deploy(kube, namespace, local_prometheus, "sequential", _chat_model("1", PER_TOKEN_MS),
            CHAT_INTERVAL_S, traffic=CHAT_TRAFFIC)  # fmt: skip
    with StreamingLoadDriver(local_cluster, namespace, NAME, NAME) as load:
        _roll_out(kube, namespace, _chat_model("2", PER_TOKEN_MS))
        status = wait_until(
            lambda: (
                (s := _status(kube, namespace)).get("stableVersion") == "2"
                and s.get("phase") == "Succeeded"
                and s
            ),
            timeout_s=ROLLOUT_S,
            what="version 2 to become stable",
        )
        wait_until(lambda: not load.weights.get("canary"), timeout_s=30.0,
                   what="the load driver to see the promoted route")  # fmt: skip
    assert [w for w in (s.weights.get("canary") for s in load.routes) if w] == STEPS
    assert all(r.status == 200 for r in load.records), "a stream failed"
    passed = [a for a in status["rollout"]["analyses"] if a["verdict"] == "Passed"]
    assert len(passed) >= len(STEPS)
    for result in passed:
        tests = {c["name"]: c for c in result["checks"] if "eValue" in c}
        assert set(tests) == {"error-rate-vs-stable", "ttft-vs-stable", "itl-vs-stable"}
        assert all(c["eValue"] < c["threshold"] == 300 for c in tests.values()), result
        assert result["tokens"] >= 50, result
        bounds = {c["name"] for c in result["checks"] if "eValue" not in c}
        assert bounds == {"ttft-p99", "itl-p99", "preemption-rate"}, result
    itl = next(c for c in status["rollout"]["evidence"]["checks"] if c["name"] == "itl-vs-stable")
    print(f"\nitl_e_value={itl['eValue']} token_gaps={itl['samples']:.0f}")


def test_g_a_generative_version_slower_per_token_is_rolled_back_on_itl(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> None:
    """(g) Version 2 takes 4x longer per token: the inter-token latency test rolls it back.

    The streams it served all succeeded; status names the ITL test and its e-value.
    """
    operator = rollout_operator()
    _deploy(kube, namespace, local_prometheus, "sequential", _chat_model("1", PER_TOKEN_MS),
            CHAT_INTERVAL_S, traffic=CHAT_TRAFFIC)  # fmt: skip
    with StreamingLoadDriver(local_cluster, namespace, NAME, NAME) as load:
        _roll_out(kube, namespace, _chat_model("2", 4 * PER_TOKEN_MS))
        status = _rolled_back(kube, namespace, operator, load)
    message = status["rollout"]["message"]
    assert "itl-vs-stable e-value" in message, message
    assert "AnalysisRejected" in _events(kube, namespace)
    checks = {c["name"]: c for c in status["rollout"]["evidence"]["checks"]}
    assert checks["itl-vs-stable"]["rejected"] is True
    assert checks["itl-vs-stable"]["eValue"] >= checks["itl-vs-stable"]["threshold"]
    assert load.by_track("canary"), "no stream reached the canary"
    assert all(r.status == 200 for r in load.records), "a stream failed"
    first = min(r.time for r in load.by_track("canary"))
    withdrawn = next(s.time for s in load.routes if s.time > first and not s.weights.get("canary"))
    print(
        f"\n{message}\nitl_rollback_after_s={withdrawn - first:.2f} (from the first canary stream)"
    )


def test_h_a_frozen_prometheus_holds_the_step_and_never_passes_it(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> None:
    """(h) The real Prometheus stopped (SIGSTOP: it accepts and never answers) at a step.

    While it is frozen the canary stays at its weight and no analysis recorded then is a pass:
    evidence gathered before the outage must not carry a step. Once it answers again the
    good version is promoted.
    """
    rollout_operator()
    _deploy(kube, namespace, local_prometheus, "sequential")
    assert local_prometheus.process is not None
    pid = local_prometheus.process.pid
    with LoadDriver(local_cluster, namespace, NAME, NAME) as load:
        _roll_out(kube, namespace, _model("2"))
        wait_until(
            lambda: _status(kube, namespace).get("canaryWeight") == STEPS[0],
            timeout_s=60.0,
            what=f"the canary at {STEPS[0]} %",
        )
        os.kill(pid, signal.SIGSTOP)
        frozen_at = datetime.now(UTC)

        def recorded_in_outage() -> list[dict[str, Any]] | None:
            since = frozen_at + timedelta(seconds=FROZEN_MARGIN_S)
            analyses = _status(kube, namespace)["rollout"].get("analyses", [])
            late = [a for a in analyses if datetime.fromisoformat(a["time"]) >= since]
            return late or None

        try:
            # A look at a frozen Prometheus waits out its query timeouts (5 s each, several
            # queries), so the first analysis of the outage comes some seconds after the freeze.
            during = wait_until(
                recorded_in_outage, timeout_s=FROZEN_S, what="an analysis during the outage"
            )
            status = _status(kube, namespace)
            weights = _route_weights(kube, namespace)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert status.get("canaryWeight") == STEPS[0], status
        assert weights == {"stable": 100 - STEPS[0], "canary": STEPS[0]}
        assert all(a["verdict"] == "Inconclusive" for a in during), during
        _wait_phase(kube, namespace, "Succeeded", ROLLOUT_S)
    assert _status(kube, namespace)["stableVersion"] == "2"
    assert all(r.status == 200 for r in load.records), "a request failed"
