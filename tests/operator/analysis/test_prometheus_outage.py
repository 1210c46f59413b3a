"""Prometheus gone mid-rollout: the step's analysis is inconclusive, never a pass.

A rollout's analysis reads a Prometheus that is a process of its own
(`prometheus_process.py`, answering over real HTTP on loopback), through the operator's
own `PrometheusSource`. The canary is healthy and looks gather evidence for most of the
step; then, just before the interval ends, Prometheus is killed (connection refused),
stopped with SIGSTOP (it accepts connections and never answers), or answers without any
series (restarted without its data). The look at the interval's end must then record an
Inconclusive analysis and hold the step, in both analysis modes, for an encoder and a
generative model, and the reconcile must be over within the query timeout's bound. With
Prometheus up the same rollout passes the step, so the outage alone makes the difference.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetserve_operator import analysis
from fleetserve_operator.analysis import (
    ITL,
    LATENCY,
    TTFT,
    HistogramTest,
    PrometheusSource,
    TrackScope,
)
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.spec import (
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutPhase,
    Verdict,
)
from fleetserve_operator.testing import QuietHandler, RollingOut, serve_http

TIMEOUT_S = 0.5
"""The query timeout the tests give `PrometheusSource` (the operator's is 5 s)."""
RECONCILE_BOUND_S = 4 * TIMEOUT_S + 2.0
"""A look reads once, then asks whether Prometheus is up: two timeouts, and slack."""
LOOK_S = 3.0
INTERVAL_S = 10.0
_START_TIMEOUT_S = 20.0


@dataclass
class PrometheusProcess:
    """The stand-in's process, its URL, and the file it answers from."""

    process: subprocess.Popen[bytes]
    url: str
    answers: Path

    def answer(self, series: dict[str, list[tuple[dict[str, str], float]]]) -> None:
        """Answer listed queries with `series`, every other one with a single 0."""
        self._write({"series": series, "default": 0})

    def answer_nothing(self) -> None:
        """Answer every query without a series, as a Prometheus with an empty TSDB."""
        self._write({"series": {}, "default": None})

    def _write(self, answers: dict[str, Any]) -> None:
        staged = self.answers.with_suffix(".tmp")
        staged.write_text(json.dumps(answers), encoding="utf-8")
        staged.rename(self.answers)

    def kill(self) -> None:
        """SIGKILL: its port refuses connections from now on."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP: connections are still accepted, and never answered."""
        self.process.send_signal(signal.SIGSTOP)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[PrometheusProcess]:
    """The stand-in, started and listening; killed (stopped or not) at the end."""
    answers, port_file = tmp_path / "answers.json", tmp_path / "port"
    script = Path(__file__).with_name("prometheus_process.py")
    stand_in = PrometheusProcess(
        subprocess.Popen([sys.executable, str(script), str(answers), str(port_file)]), "", answers
    )
    stand_in.answer_nothing()
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not port_file.exists():
            assert stand_in.process.poll() is None, "the Prometheus stand-in exited"
            assert time.monotonic() < deadline, "the Prometheus stand-in did not listen"
            time.sleep(0.05)
        stand_in.url = f"http://127.0.0.1:{port_file.read_text(encoding='utf-8')}"
        yield stand_in
    finally:
        if stand_in.process.poll() is None:
            stand_in.kill()


def _spec(url: str, mode: str, generative: bool) -> Any:
    model = "builtin://synthetic-generate" if generative else "builtin://synthetic"
    checks = {"prometheusUrl": url, "mode": mode, "minRequests": 20, "minTokens": 300}

    def spec(version: str) -> dict[str, Any]:
        return {
            "model": {"name": "demo", "version": version, "uri": model},
            "rollout": {"steps": [50, 100], "interval": f"{INTERVAL_S:g}s", "analysis": checks},
            "traffic": {"provider": "gateway-api", "parentRefs": [{"name": "gw"}],
                        "hostnames": ["demo.example"]},
        }  # fmt: skip

    return spec


def _counters(
    scope: TrackScope, requests: float, generative: bool
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A healthy track's cumulative counters after `requests` answers: no error, all fast."""
    tests: tuple[HistogramTest, ...] = (TTFT, ITL) if generative else (LATENCY,)
    series = {analysis.codes_query(scope): [({"code": "200"}, requests)]}
    for test in tests:
        les = [*(f"{bound:g}" for bound in test.bounds), "+Inf"]
        series[analysis.buckets_query(scope, test)] = [({"le": le}, requests) for le in les]
    if generative:
        series[analysis.generated_query(scope)] = [({}, 50 * requests)]
    return series


def _healthy(world: RollingOut, looks: int, generative: bool) -> dict[str, Any]:
    """Both tracks after `looks` looks (cumulative), and the threshold mode's windows."""
    target = analysis.target_for(_parsed_spec(world), world.started, namespace="ns")
    return {
        **_counters(target.canary, 100.0 * looks, generative),
        **_counters(target.stable, 1000.0 + 1000.0 * looks, generative),
        analysis.requests_query(target.canary, target.window): [({}, 300.0)],
        analysis.tokens_query(target.canary, target.window): [({}, 15000.0)],
    }


def _parsed_spec(world: RollingOut) -> InferenceServiceSpec:
    body = world.kube.get_inference_service("ns", world.name)
    assert body is not None
    return InferenceServiceSpec.model_validate(body["spec"])


OUTAGES = ["none", "killed", "frozen", "no-series"]


@pytest.mark.parametrize("outage", OUTAGES)
@pytest.mark.parametrize("generative", [False, True], ids=["encoder", "generative"])
@pytest.mark.parametrize("mode", ["sequential", "threshold"])
def test_an_outage_at_the_intervals_end_holds_the_step(
    prometheus: PrometheusProcess, mode: str, generative: bool, outage: str
) -> None:
    """Evidence gathered before the outage never passes the step; Prometheus up, it does."""
    world = RollingOut(_spec(prometheus.url, mode, generative), name="demo")
    world.sync = Sync(
        world.kube, metrics=world.metrics, clock=lambda: world.clock.now,
        metric_source=lambda url: PrometheusSource(url, timeout_s=TIMEOUT_S),
    )  # fmt: skip
    for look in range(1, 4):
        prometheus.answer(_healthy(world, look, generative))
        status = world.reconcile(after_s=LOOK_S)
        assert (status.phase, status.canary_weight) == (RolloutPhase.PROGRESSING, 50)
        assert status.rollout.analyses == []
    if mode == "sequential":
        evidence = status.rollout.evidence
        assert evidence is not None
        assert evidence.step_samples >= 200, "no evidence before the outage"
    prometheus.answer(_healthy(world, 4, generative))
    match outage:
        case "killed":
            prometheus.kill()
        case "frozen":
            prometheus.freeze()
        case "no-series":
            prometheus.answer_nothing()
    started = time.monotonic()
    status = world.reconcile(after_s=INTERVAL_S - 3 * LOOK_S)
    took = time.monotonic() - started
    assert took < RECONCILE_BOUND_S, f"the look took {took:.1f} s"
    (result,) = status.rollout.analyses
    if outage == "none":
        assert result.verdict is Verdict.PASSED, result.message
        assert status.canary_weight == 100
        return
    assert result.verdict is Verdict.INCONCLUSIVE, result.message
    assert (status.phase, status.canary_weight) == (RolloutPhase.PROGRESSING, 50)
    _assert_held(world, status)


def _assert_held(world: RollingOut, status: InferenceServiceStatus) -> None:
    """Further looks in the outage never pass either: the rollout holds at 50%."""
    for _ in range(3):
        status = world.reconcile(after_s=INTERVAL_S)
        assert all(a.verdict is Verdict.INCONCLUSIVE for a in status.rollout.analyses)
        assert status.canary_weight == 50
    assert status.phase is RolloutPhase.HOLDING


def test_an_answer_that_trickles_in_is_cut_at_the_timeout() -> None:
    """A Prometheus sending its answer a byte at a time fails the query within 2 x timeout."""

    class Trickle(QuietHandler):
        def do_GET(self) -> None:  # http.server's naming
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(TIMEOUT_S / 5)

    with serve_http(Trickle) as url:
        source = PrometheusSource(url, timeout_s=TIMEOUT_S)
        started = time.monotonic()
        with pytest.raises(MetricsUnavailable, match="within"):
            source.query("up")
        assert time.monotonic() - started < 2 * TIMEOUT_S + 0.5


def test_a_frozen_prometheus_fails_a_query_after_the_timeout(
    prometheus: PrometheusProcess,
) -> None:
    """SIGSTOPped: the connection is accepted and nothing answers; the query gives up."""
    prometheus.freeze()
    source = PrometheusSource(prometheus.url, timeout_s=TIMEOUT_S)
    started = time.monotonic()
    with pytest.raises(MetricsUnavailable, match="no answer within"):
        source.query("up")
    assert time.monotonic() - started < TIMEOUT_S + 0.5
    assert not source.is_online()
