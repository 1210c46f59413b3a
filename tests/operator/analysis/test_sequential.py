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
    assert [c.name for c in evidence.checks] == [ERROR_TEST, LATENCY_TEST, "error-rate"]
    assert {c.e_value for c in evidence.checks} == {1.0}
    # Two tests against stable, the maxErrorRate test and the 100% step's baseline: α/4.
    assert {c.threshold for c in evidence.checks} == {400.0}


def test_after_a_shadow_stage_the_canary_counts_from_its_first_look() -> None:
    """The copies it answered while shadowing are no step's traffic: they are not counted."""
    copies = _counts(300, 30)  # errors among copies must not reject the first step
    evidence = accumulate(SPEC, None, copies, _counts(5000, 10), canary_from_now=True)
    assert evidence.canary == copies
    evidence = accumulate(SPEC, evidence, _counts(320, 30), _counts(5080, 10))
    assert evidence.step_samples == 20
    assert not evidence.rejected


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


def test_canary_requests_without_stable_requests_test_only_the_canarys_own_bounds() -> None:
    """Below 100% an increment stable missed (a scrape not in yet) is no share to compare.

    The step's sample size grows, the tests against stable learn nothing, the canary's
    error rate is still held to `maxErrorRate`.
    """
    first = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    after = accumulate(SPEC, first, _counts(50, 5), _counts(1000, 0))
    assert after.step_samples == 50
    for before, now in zip(first.checks[:2], after.checks[:2], strict=True):
        assert (now.log_likelihood_ratios, now.samples) == (before.log_likelihood_ratios, 0)
        assert now.power is not None
        assert before.power is not None
        assert now.power.log_likelihood_ratios == before.power.log_likelihood_ratios
    assert after.stable == first.stable
    assert after.baseline is None
    bound = after.checks[2]
    assert (bound.name, bound.samples) == ("error-rate", 50)
    assert bound.e_value > 1


def test_a_rejection_fails_the_analysis_before_the_interval_ends() -> None:
    """`watch` returns a Failed result at once, naming the test, its e-value and threshold."""
    start = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    source = _source(_counts(30, 6), _counts(1120, 0))
    evidence, result = watch(source, SPEC, TARGET, start, due=False)
    assert evidence is not None
    assert result is not None
    assert result.verdict is Verdict.FAILED
    check = result.checks[0]
    assert (check.name, check.outcome, check.threshold) == (ERROR_TEST, CheckOutcome.REJECTED, 400)
    assert check.e_value is not None
    assert check.e_value >= 400
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
    assert [c.outcome for c in result.checks] == [CheckOutcome.PASSED] * 3


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


GATED = AnalysisTarget(CANARY, STABLE, "10s", gated=True)
ALONE = AnalysisTarget(CANARY, STABLE, "10s", gated=True, canary_alone=True)


def _slow_counts(requests: float, errors: float, slow: float) -> TrackCounts:
    """Counters where `slow` answers took 300 ms and the rest under 10 ms."""
    buckets = [requests - slow if b < 0.5 and b >= 0.01 else (requests if b >= 0.5 else 0.0)
               for b in LATENCY_BOUNDS_S]  # fmt: skip
    return TrackCounts(requests=requests, errors=errors, latency_buckets=[*buckets, requests])


def test_a_gated_step_holds_until_the_evidence_rules_out_the_detectable_regression() -> None:
    """Its interval over, a step before half of the traffic needs the power gates cleared.

    With 100 canary requests the error gate has not: InsufficientEvidence, naming what each
    test has seen and about how much it needs, and nothing is queried. 3000 error-free
    requests, as fast as stable's, clear both gates, and the step passes.
    """
    start = accumulate(SPEC, None, _counts(0, 0), _counts(1000, 0))
    source = _source(_counts(100, 0), _counts(1400, 0))
    evidence, held = watch(source, SPEC, GATED, start, due=True)
    assert held is not None
    assert (held.verdict, held.reason) == (
        Verdict.INCONCLUSIVE,
        InconclusiveReason.INSUFFICIENT_EVIDENCE,
    )
    assert f"{ERROR_TEST} has 100 of about" in held.message
    assert "to rule out 2x stable's odds at power 0.9" in held.message
    _, ungated = watch(source, SPEC, TARGET, start, due=True)
    assert ungated is not None
    assert ungated.verdict is Verdict.PASSED, "a step before at most half of the traffic"
    assert evidence is not None
    error_gate = evidence.checks[0].power
    assert error_gate is not None
    assert error_gate.samples_needed is not None
    assert 100 < error_gate.samples_needed < 3000
    _, passed = watch(_source(_counts(3000, 0), _counts(13000, 0)), SPEC, GATED, evidence, due=True)
    assert passed is not None
    assert passed.verdict is Verdict.PASSED, passed.message


def test_a_canary_twice_as_likely_to_fail_is_held_and_rejected_never_passed() -> None:
    """4% errors over stable's 2%, within `maxErrorRate`: the gate never clears.

    The error test against stable rejects instead.
    """
    spec = SPEC.model_copy(update={"max_error_rate": 0.05})
    evidence = accumulate(spec, None, _counts(0, 0), _counts(10_000, 200))
    for look in range(1, 200):
        evidence = accumulate(spec, evidence, _counts(100 * look, 4 * look),
                              _counts(10_000 + 100 * look, 200 + 2 * look))  # fmt: skip
        assert not evidence.checks[0].power or not evidence.checks[0].power.cleared
        if evidence.rejected:
            break
    assert [c.name for c in evidence.rejected][:1] == [ERROR_TEST]


def test_the_latency_gate_judges_answers_slower_than_stables_p99_bucket() -> None:
    """Stable's slowest 2% take 300 ms, its p99 in the 250-500 ms bucket: slow is over 500 ms.

    With 0.5% of them, p99 is under 10 ms, and so is the bound.
    """
    evidence = accumulate(SPEC, None, _counts(0, 0), _slow_counts(10_000, 0, 200))
    latency = evidence.checks[1].power
    assert latency is not None
    assert latency.bound_s == 0.5
    fast = accumulate(SPEC, None, _counts(0, 0), _slow_counts(10_000, 0, 50)).checks[1].power
    assert fast is not None
    assert fast.bound_s == 0.01
    few = accumulate(SPEC, None, _counts(0, 0), _counts(99, 0))
    assert few.checks[1].power is not None
    assert few.checks[1].power.bound_s is None, "fewer than 100 answers pick no bound"


def test_at_100_percent_the_canary_is_held_to_stables_baseline() -> None:
    """Stable answers nothing at 100%: its counters then are the baseline, fixed from there.

    A canary failing 5% against a baseline of 1% is rejected by the error test; one like the
    baseline is not, and clears its gate.
    """
    stable = _counts(20_000, 200)
    start = accumulate(SPEC, None, _counts(0, 0), stable)
    worse, like = start, start
    for look in range(1, 100):
        worse = accumulate(SPEC, worse, _counts(200 * look, 10 * look), stable, canary_alone=True)
        like = accumulate(SPEC, like, _counts(200 * look, 2 * look), stable, canary_alone=True)
    assert worse.baseline == like.baseline == stable
    assert [c.name for c in worse.rejected][:1] == [ERROR_TEST]
    assert not like.rejected
    assert like.checks[0].power is not None
    assert like.checks[0].power.cleared
    later = accumulate(SPEC, like, _counts(30_000, 300), _counts(20_100, 201), canary_alone=True)
    assert later.baseline == stable


def test_max_error_rate_is_a_test_of_the_canarys_own_rate() -> None:
    """Canary and stable both fail 3%: nothing against stable, but `maxErrorRate` 0.02 rejects."""
    spec = SPEC.model_copy(update={"max_error_rate": 0.02})
    evidence = accumulate(spec, None, _counts(0, 0), _counts(10_000, 300))
    for look in range(1, 200):
        evidence = accumulate(spec, evidence, _counts(200 * look, 6 * look),
                              _counts(10_000 + 200 * look, 300 + 6 * look))  # fmt: skip
        if evidence.rejected:
            break
    assert [c.name for c in evidence.rejected] == ["error-rate"]


def test_max_p99_latency_is_a_test_of_the_canarys_own_answers() -> None:
    """Every answer of both tracks slower than 250 ms against `maxP99LatencyMs: 200`.

    It is judged at the 250 ms bucket bound, and rejects; stable is no faster, so the
    latency test against stable does not.
    """
    spec = SPEC.model_copy(update={"max_p99_latency_ms": 200.0})
    evidence = accumulate(spec, None, _counts(0, 0), _slow_counts(1000, 0, 1000))
    evidence = accumulate(spec, evidence, _slow_counts(100, 0, 100), _slow_counts(1400, 0, 1400))
    assert [c.name for c in evidence.checks][2:] == ["error-rate", "p99-latency"]
    assert [c.name for c in evidence.rejected] == ["p99-latency"]


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
    """Looks between scrapes (same counters) write nothing; a healthy step then passes.

    The 20% step leads to 100%: its 3000 error-free canary requests, as fast as stable's
    answers, rule out a regression to 2x the odds of 1%.
    """
    rollout = _Rollout()
    rollout.counters(_counts(0, 0), _counts(1000, 0))
    rollout.reconcile(after_s=1)
    rollout.counters(_counts(3000, 0), _counts(13000, 1))
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


def test_a_gated_step_holds_for_evidence_then_advances_at_the_look_it_clears() -> None:
    """The 20% step leads to 100%: at its interval's end 100 canary requests are too few.

    The step holds (Holding, one Normal Event, nothing counted or kept in the history),
    status says what the error test has seen and needs; at the first look where the gates
    clear, the step passes without waiting for another interval.
    """
    rollout = _Rollout()
    rollout.counters(_counts(0, 0), _counts(1000, 0))
    rollout.reconcile(after_s=1)
    rollout.counters(_counts(100, 0), _counts(1400, 0))
    status = rollout.reconcile(after_s=60)
    assert (status.phase, status.canary_weight) == ("Holding", 20)
    assert status.rollout.message.startswith("holding for evidence at 20%")
    assert f"{ERROR_TEST} has 100 of about" in status.rollout.message
    assert (status.rollout.analyses, status.rollout.inconclusive_analyses) == ([], 0)
    for look in range(1, 4):
        rollout.counters(_counts(100 + look, 0), _counts(1400 + 4 * look, 0))
        status = rollout.reconcile(after_s=1)
        assert status.phase == "Holding"
    reasons = [event.reason for event in rollout.kube.events]
    assert reasons.count("HoldingForEvidence") == 1
    rollout.counters(_counts(3000, 0), _counts(13000, 0))
    status = rollout.reconcile(after_s=1)
    assert (status.phase, status.canary_weight) == ("Progressing", 100)
    assert status.rollout.analyses[-1].verdict is Verdict.PASSED


def test_a_step_held_for_evidence_past_its_deadline_is_rolled_back() -> None:
    """`progressDeadline` (10m) after the interval without enough evidence: rolled back."""
    rollout = _Rollout()
    rollout.counters(_counts(0, 0), _counts(1000, 0))
    rollout.reconcile(after_s=1)
    rollout.counters(_counts(100, 0), _counts(1400, 0))
    assert rollout.reconcile(after_s=60).phase == "Holding"
    rollout.counters(_counts(150, 0), _counts(1600, 0))
    assert rollout.reconcile(after_s=540).phase == "Holding"
    rollout.counters(_counts(160, 0), _counts(1640, 0))
    status = rollout.reconcile(after_s=60)
    assert (status.phase, status.canary_weight) == ("RolledBack", 0)
    assert status.rollout.message.startswith("ProgressDeadlineExceeded")
    value = rollout.metrics.registry.get_sample_value(
        OperatorCounter.ROLLBACKS.value, {"reason": "ProgressDeadlineExceeded"}
    )
    assert value == 1
