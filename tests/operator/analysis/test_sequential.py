"""Sequential mode wired in: counters read, evidence kept in status, verdicts, reconciles."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from fleetserve_operator.analysis import (
    ERROR_TEST,
    LATENCY,
    LATENCY_TEST,
    AnalysisTarget,
    PrometheusSource,
    TrackScope,
    accumulate,
    buckets_query,
    codes_query,
    read_counts,
    watch,
)
from fleetserve_operator.contract import LATENCY_BOUNDS_S
from fleetserve_operator.naming import Track
from fleetserve_operator.rollout import OperatorCounter
from fleetserve_operator.spec import (
    AnalysisSpec,
    CheckOutcome,
    InconclusiveReason,
    MetricCheck,
    TrackCounts,
    Verdict,
)
from fleetserve_operator.testing import (
    QuietHandler,
    RollingOut,
    ScriptedMetricSource,
    serve_http,
)

SPEC = AnalysisSpec(prometheus_url="http://prom:9090", mode="sequential", min_requests=20)
CANARY = TrackScope("ns", "demo", "2", Track.CANARY)
STABLE = TrackScope("ns", "demo", "1", Track.STABLE)
TARGET = AnalysisTarget(CANARY, STABLE, "10s")
LES = [*(repr(bound) for bound in LATENCY_BOUNDS_S), "+Inf"]


def _counts(requests: float, errors: float, fast: float | None = None) -> TrackCounts:
    """Counters where `fast` answers (all, by default) took under 10 ms."""
    quick = requests if fast is None else fast
    buckets = [quick if bound >= 0.01 else 0.0 for bound in LATENCY_BOUNDS_S]
    return TrackCounts(requests=requests, errors=errors, latency_buckets=[*buckets, requests])


def _script(source: ScriptedMetricSource, scope: TrackScope, counts: TrackCounts) -> None:
    """Answer the track's two counter queries with `counts`."""
    ok = counts.requests - counts.errors
    source.vectors[codes_query(scope)] = {"200": ok, "500": counts.errors, "503": 0.0}
    buckets = buckets_query(scope, LATENCY)
    source.vectors[buckets] = dict(zip(LES, counts.latency_buckets, strict=True))


def _source(canary: TrackCounts, stable: TrackCounts) -> ScriptedMetricSource:
    source = ScriptedMetricSource()
    _script(source, CANARY, canary)
    _script(source, STABLE, stable)
    return source


def test_counters_are_read_by_code_and_by_bucket() -> None:
    """5xx codes are errors; buckets come back in the bounds' order, +Inf last."""
    source = _source(_counts(100, 7, fast=60), _counts(10, 0))
    assert read_counts(source, CANARY) == _counts(100, 7, fast=60)
    assert 'track="canary"' in source.queries[0]
    assert read_counts(ScriptedMetricSource(), CANARY) is None


def test_evidence_starts_with_the_canary_from_zero_and_stable_from_now() -> None:
    """The canary's series exist from its load at 0; stable's past is not comparable."""
    evidence = accumulate(SPEC, None, _counts(30, 3), _counts(5000, 10))
    assert evidence.canary == TrackCounts(latency_buckets=[0.0] * (len(LATENCY_BOUNDS_S) + 1))
    assert evidence.stable == _counts(5000, 10)
    assert [c.name for c in evidence.checks] == [ERROR_TEST, LATENCY_TEST]
    assert {c.e_value for c in evidence.checks} == {1.0}
    assert {c.threshold for c in evidence.checks} == {200.0}


def test_canary_errors_raise_the_error_e_value_until_it_rejects() -> None:
    """Each increment goes in once; stable's errors in proportion would not move it."""
    evidence = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    for look in range(1, 4):
        evidence = accumulate(SPEC, evidence, _counts(20 * look, 2 * look),
                              _counts(1000 + 80 * look, 0))  # fmt: skip
    errors = evidence.checks[0]
    assert errors.samples == 60
    assert evidence.step_samples == 60
    assert errors.rejected
    assert errors.e_value >= errors.threshold
    assert len(errors.log_likelihood_ratios) == 6
    assert not evidence.checks[1].rejected


def test_the_same_counters_read_twice_change_nothing() -> None:
    """A look between two scrapes writes nothing: the evidence is equal."""
    first = accumulate(SPEC, None, _counts(0, 0), _counts(100, 0))
    second = accumulate(SPEC, first, _counts(20, 1), _counts(180, 1))
    assert accumulate(SPEC, second, _counts(20, 1), _counts(180, 1)) == second


def test_a_slow_canary_raises_the_latency_e_value() -> None:
    """Every canary answer above 10 ms while stable's are under it: the latency test rejects."""
    evidence = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    evidence = accumulate(SPEC, evidence, _counts(40, 0, fast=0), _counts(1160, 0))
    assert evidence.checks[1].rejected
    assert not evidence.checks[0].rejected


def test_a_track_whose_sums_went_back_is_read_afresh() -> None:
    """A stable pod restarted: its counters start over, and that increment is skipped."""
    first = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    after = accumulate(SPEC, first, _counts(50, 5), _counts(400, 0))
    assert after.stable == _counts(400, 0)
    assert after.canary == first.canary
    assert after.checks == first.checks


def test_canary_requests_without_stable_requests_count_as_samples_only() -> None:
    """At 100% stable serves nothing: the step's sample size grows, the tests learn nothing."""
    first = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    after = accumulate(SPEC, first, _counts(50, 5), _counts(1000, 0))
    assert after.step_samples == 50
    assert after.checks == first.checks
    assert after.stable == first.stable


def test_a_rejection_fails_the_analysis_before_the_interval_ends() -> None:
    """`watch` returns a Failed result at once, naming the test, its e-value and threshold."""
    start = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    source = _source(_counts(30, 6), _counts(1120, 0))
    evidence, result = watch(source, SPEC, TARGET, start, due=False)
    assert evidence is not None
    assert result is not None
    assert result.verdict is Verdict.FAILED
    check = result.checks[0]
    assert (check.name, check.outcome, check.threshold) == (ERROR_TEST, CheckOutcome.REJECTED, 200)
    assert check.e_value is not None
    assert check.e_value >= 200
    assert check.samples == 30
    assert f"{ERROR_TEST} e-value" in result.message


def test_without_rejection_no_result_until_the_interval_ends() -> None:
    """Mid-interval looks only update the evidence; at the end the step passes."""
    start = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    source = _source(_counts(30, 0), _counts(1120, 1))
    evidence, result = watch(source, SPEC, TARGET, start, due=False)
    assert result is None
    assert evidence is not None
    assert evidence.step_samples == 30
    _, result = watch(source, SPEC, TARGET, evidence, due=True)
    assert result is not None
    assert result.verdict is Verdict.PASSED
    assert [c.outcome for c in result.checks] == [CheckOutcome.PASSED] * 2


def test_too_few_samples_at_the_interval_end_are_inconclusive() -> None:
    """No data is never a pass: fewer than `minRequests` canary requests this step."""
    start = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    _, result = watch(_source(_counts(5, 0), _counts(1020, 0)), SPEC, TARGET, start, due=True)
    assert result is not None
    assert (result.verdict, result.reason) == (
        Verdict.INCONCLUSIVE,
        InconclusiveReason.TOO_FEW_REQUESTS,
    )
    _, nothing = watch(ScriptedMetricSource(), SPEC, TARGET, None, due=True)
    assert nothing is not None
    assert nothing.reason is InconclusiveReason.NO_DATA


def test_no_series_at_the_interval_end_never_passes_on_earlier_evidence() -> None:
    """A Prometheus that lost its data answers no series: the evidence is kept, no pass."""
    start = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    healthy = accumulate(SPEC, start, _counts(300, 0), _counts(4000, 0))
    _, read = watch(_source(_counts(300, 0), _counts(4000, 0)), SPEC, TARGET, healthy, due=True)
    assert read is not None
    assert read.verdict is Verdict.PASSED, "the same evidence passes when Prometheus answers"
    evidence, result = watch(ScriptedMetricSource(), SPEC, TARGET, healthy, due=True)
    assert evidence == healthy
    assert result is not None
    assert (result.verdict, result.reason) == (Verdict.INCONCLUSIVE, InconclusiveReason.NO_DATA)
    assert "canary and stable" in result.message


def test_prometheus_down_keeps_the_evidence() -> None:
    """A failed read changes nothing; at the interval end it is PrometheusDown."""
    start = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    source = ScriptedMetricSource(online=False, failing={codes_query(CANARY)})
    assert watch(source, SPEC, TARGET, start, due=False) == (start, None)
    evidence, result = watch(source, SPEC, TARGET, start, due=True)
    assert evidence == start
    assert result is not None
    assert result.reason is InconclusiveReason.PROMETHEUS_DOWN


def test_users_checks_still_apply_at_the_interval_end() -> None:
    """A PromQL check out of bounds fails the step even when no test rejected."""
    check = MetricCheck(name="gpu-util", query="util{version='$version'}", max=0.5)
    spec = SPEC.model_copy(update={"checks": [check]})
    start = accumulate(spec, None, _counts(0, 0), _counts(1000, 0))
    source = _source(_counts(30, 0), _counts(1120, 1))
    source.values["util{version='2'}"] = 0.9
    _, result = watch(source, spec, TARGET, start, due=True)
    assert result is not None
    assert result.verdict is Verdict.FAILED
    assert "gpu-util" in result.message


@pytest.fixture
def prometheus_vector() -> Iterator[str]:
    """A loopback Prometheus answering every query with a two-series vector by `code`."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # http.server's naming
            result = [
                {"metric": {"code": "200"}, "value": [0, "120"]},
                {"metric": {"code": "500"}, "value": [0, "3"]},
            ]
            data = {"resultType": "vector", "result": result}
            self.reply(200, json.dumps({"status": "success", "data": data}).encode())

    with serve_http(Handler) as url:
        yield url


def test_prometheus_vectors_are_read_by_label(prometheus_vector: str) -> None:
    """`query_by` over real HTTP: each series' value under its label's value."""
    source = PrometheusSource(prometheus_vector)
    assert source.query_by("sum by (code) (x)", "code") == {"200": 120.0, "500": 3.0}


# A whole reconcile: sequential mode on the Sync, with the canary's counters scripted.

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}]}


def _service_spec(version: str) -> dict[str, Any]:
    analysis_spec = {"prometheusUrl": "http://prom:9090", "mode": "sequential", "minRequests": 20}
    return {
        "model": {"name": "demo", "version": version, "uri": "builtin://synthetic"},
        "rollout": {"steps": [20, 100], "interval": "60s", "analysis": analysis_spec},
        "traffic": GATEWAY,
    }


class _Rollout(RollingOut):
    """The service of `_service_spec`, rolling version 2 out at the 20% step."""

    def __init__(self) -> None:
        super().__init__(_service_spec, name="demo")
        assert self.started.canary_weight == 20

    def counters(self, canary: TrackCounts, stable: TrackCounts) -> None:
        _script(self.source, CANARY, canary)
        _script(self.source, STABLE, stable)

    def status_writes(self) -> int:
        return sum(1 for write in self.kube.writes if write[0] == "status")


def test_a_rejecting_canary_is_rolled_back_at_the_next_look() -> None:
    """Seconds into a 60 s step: weight 0, RolledBack, the evidence and an Event in status."""
    rollout = _Rollout()
    rollout.counters(_counts(0, 0), _counts(1000, 0))
    status = rollout.reconcile(after_s=1)
    assert status.rollout.evidence is not None
    rollout.counters(_counts(30, 6), _counts(1120, 0))
    status = rollout.reconcile(after_s=1)
    assert (status.phase, status.canary_weight) == ("RolledBack", 0)
    assert status.rollout.evidence is not None
    assert status.rollout.evidence.checks[0].rejected
    assert ERROR_TEST in status.rollout.message
    reasons = [event.reason for event in rollout.kube.events]
    assert "AnalysisRejected" in reasons
    value = rollout.metrics.registry.get_sample_value(
        OperatorCounter.ROLLBACKS.value, {"reason": "AnalysisRejected"}
    )
    assert value == 1


def test_status_is_written_only_when_the_evidence_changed() -> None:
    """Looks between scrapes (same counters) write nothing; a healthy step then passes."""
    rollout = _Rollout()
    rollout.counters(_counts(0, 0), _counts(1000, 0))
    rollout.reconcile(after_s=1)
    rollout.counters(_counts(30, 0), _counts(1120, 1))
    rollout.reconcile(after_s=1)
    writes = rollout.status_writes()
    for _ in range(5):
        rollout.reconcile(after_s=1)
    assert rollout.status_writes() == writes
    status = rollout.reconcile(after_s=60)
    assert status.canary_weight == 100
    assert status.rollout.analyses[-1].verdict is Verdict.PASSED
    assert status.rollout.evidence is not None
    assert status.rollout.evidence.step_samples == 0
