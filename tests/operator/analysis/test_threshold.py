"""Canary analysis: the PromQL it builds and the verdicts it reaches from scripted values."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleetserve_operator import analysis
from fleetserve_operator.analysis import (
    SERVER_ERRORS,
    AnalysisTarget,
    TrackScope,
    code_ratio_query,
    evaluate,
    p99_ms_query,
    requests_query,
    target_for,
)
from fleetserve_operator.contract import QUEUE_WAIT_METRIC, REQUEST_DURATION_METRIC
from fleetserve_operator.naming import Track
from fleetserve_operator.spec import AnalysisSpec, InferenceServiceStatus
from fleetserve_operator.testing import ScriptedMetricSource, make_spec
from tests.operator.analysis.window_answers import window_answers

CANARY = TrackScope("ns", "demo", "2", Track.CANARY)
STABLE = TrackScope("ns", "demo", "1", Track.STABLE)
TARGET = AnalysisTarget(CANARY, STABLE, "1m", queue_wait_floor_ms=10.0)
SPEC = AnalysisSpec(
    prometheus_url="http://prometheus:9090", mode="threshold", max_p99_latency_ms=500
)


def scripted(**overrides: float | None) -> ScriptedMetricSource:
    """A healthy canary and stable (500 requests, no errors, 50 ms p99), with overrides."""
    figures: dict[str, float | None] = {
        "requests": 500.0,
        "errors": 0.0,
        "p99": 50.0,
        "stable_p99": 50.0,
        "queue": 5.0,
        "stable_queue": 5.0,
        "rejections": 0.0,
        "stable_rejections": 0.0,
    }
    figures.update(overrides)
    p99s = {"p99": REQUEST_DURATION_METRIC, "queue": QUEUE_WAIT_METRIC}
    return ScriptedMetricSource(values=window_answers(TARGET, figures, p99s))


def test_selector_and_requests_query() -> None:
    """Series are picked by the scrape's namespace and the runtime's model/version/track."""
    assert requests_query(CANARY, "1m") == (
        'sum(increase(fleetserve_requests_total{namespace="ns",model="demo",version="2",'
        'track="canary"}[60s]))'
    )


def test_error_ratio_query_counts_no_errors_as_zero() -> None:
    """5xx / all, with `or vector(0)` so that a clean canary is 0, not "no data"."""
    assert code_ratio_query(CANARY, "2m", SERVER_ERRORS) == (
        '(sum(rate(fleetserve_requests_total{namespace="ns",model="demo",version="2",'
        'track="canary",code=~"5.."}[120s])) or vector(0)) / '
        'sum(rate(fleetserve_requests_total{namespace="ns",model="demo",version="2",'
        'track="canary"}[120s]))'
    )


def test_p99_query_in_milliseconds_with_offset() -> None:
    """p99 from the histogram's buckets, in ms; the offset reads an earlier window."""
    scope = TrackScope("ns", "demo", "1", Track.STABLE, offset="1m")
    assert p99_ms_query(REQUEST_DURATION_METRIC, scope, "1m") == (
        "1000 * histogram_quantile(0.99, sum by (le) (rate(fleetserve_request_duration_seconds"
        '_bucket{namespace="ns",model="demo",version="1",track="stable"}[60s] offset 60s)))'
    )


@pytest.mark.parametrize(
    ("duration", "rendered"),
    [
        ("1m", "60s"),
        ("1.5m", "90s"),
        ("1h0.5m", "3630s"),
        ("2.5s", "2500ms"),
        ("0.25s", "250ms"),
        ("0.1ms", "1ms"),
        ("0s", "1ms"),
    ],
)
def test_durations_are_spelled_as_promql_takes_them(duration: str, rendered: str) -> None:
    """No fraction (PromQL refuses `1.5m`) and no zero range (PromQL refuses `0s`)."""
    assert analysis.promql_duration(duration) == rendered


@pytest.mark.parametrize(
    "rollout",
    [
        pytest.param({"interval": "1m", "analysis": {"window": "1.5m"}}, id="window"),
        pytest.param({"interval": "1.5m", "analysis": {}}, id="interval-as-window"),
    ],
)
def test_a_fractional_window_renders_whole_ranges(rollout: dict[str, Any]) -> None:
    """Every range and offset of every query (custom checks too) is a whole 90s."""
    custom = {"name": "c", "query": "sum(rate(x[$window]))", "max": 1}
    checks = {"prometheusUrl": "http://p:9090", "checks": [custom], **rollout["analysis"]}
    spec = make_spec(rollout={**rollout, "analysis": checks})
    assert spec.rollout.analysis is not None
    status = InferenceServiceStatus(stable_version="1", canary_version="2", canary_weight=100)
    target = target_for(spec, status, namespace="ns")
    planned = analysis.plan_checks(spec.rollout.analysis, target)
    queries = [requests_query(target.canary, target.window)]
    queries += [q for check in planned for q in (check.query, check.baseline) if q is not None]
    ranges = [r for query in queries for r in re.findall(r"\[([^\]]*)\]", query)]
    offsets = [o for query in queries for o in re.findall(r"offset (\S+?)\)", query)]
    assert len(ranges) > len(planned)
    assert offsets
    assert set(ranges) | set(offsets) == {"90s"}


@pytest.mark.parametrize(
    ("weight", "offset"),
    [pytest.param(20, None, id="stable-has-traffic"), pytest.param(100, "30s", id="at-100")],
)
def test_target_reads_stable_baseline_before_the_last_step(weight: int, offset: str | None) -> None:
    """At 100% the stable gets no traffic, so its baseline comes from the window before."""
    spec = make_spec(rollout={"interval": "30s"})
    status = InferenceServiceStatus(stable_version="1", canary_version="2", canary_weight=weight)
    target = target_for(spec, status, namespace="ns")
    assert (target.canary.version, target.stable.version, target.window) == ("2", "1", "30s")
    assert target.stable.offset == offset
    assert target.queue_wait_floor_ms == spec.batching.max_queue_delay_ms


def test_custom_check_placeholders_are_substituted() -> None:
    """`$namespace`, `$model`, `$version`, `$track`, `$window` name the canary's series."""
    check = {"name": "oom", "query": 'sum(x{ns="$namespace",v="$version"}[$window])', "max": 0}
    spec = AnalysisSpec.model_validate({"prometheusUrl": "http://p:9090", "checks": [check]})
    custom = analysis.plan_checks(spec, TARGET)[-1]
    assert (custom.name, custom.query, custom.max) == ("oom", 'sum(x{ns="ns",v="2"}[60s])', 0)


@pytest.mark.parametrize(
    ("overrides", "verdict", "reason", "failing"),
    [
        pytest.param({}, "Passed", None, [], id="healthy"),
        pytest.param({"errors": 0.2}, "Failed", None, ["error-rate"], id="error-spike"),
        pytest.param(
            {"p99": 160.0}, "Failed", None, ["p99-latency-vs-stable"], id="latency-ratio-only"
        ),
        pytest.param(
            {"p99": 900.0, "stable_p99": 800.0}, "Failed", None, ["p99-latency"], id="absolute-p99"
        ),
        pytest.param({"requests": 5.0}, "Inconclusive", "TooFewRequests", [], id="too-few"),
        pytest.param({"requests": None}, "Inconclusive", "TooFewRequests", [], id="no-traffic"),
        pytest.param({"stable_p99": None}, "Inconclusive", "NoData", [], id="stable-no-data"),
        pytest.param({"p99": float("nan")}, "Inconclusive", "NoData", [], id="nan-is-no-data"),
        pytest.param(
            {"errors": 0.5, "stable_p99": None}, "Failed", None, ["error-rate"], id="fail-wins"
        ),
        pytest.param({"queue": 9.0, "stable_queue": 1.0}, "Passed", None, [], id="queue-floor"),
        pytest.param(
            {"queue": 40.0, "stable_queue": 10.0},
            "Failed",
            None,
            ["queue-wait-p99-vs-stable"],
            id="queue-regression",
        ),
        pytest.param({"rejections": 0.005}, "Passed", None, [], id="rejection-floor"),
        pytest.param(
            {"rejections": 0.3, "stable_rejections": 0.1, "errors": 0.0},
            "Failed",
            None,
            ["rejection-ratio-vs-stable"],
            id="rejection-regression",
        ),
    ],
)
def test_evaluate(
    overrides: dict[str, Any], verdict: str, reason: str | None, failing: list[str]
) -> None:
    """Scripted values give the verdict; failed checks are named with values and bounds."""
    result = evaluate(scripted(**overrides), SPEC, TARGET)
    assert (result.verdict, result.reason) == (verdict, reason)
    assert [c.name for c in result.checks if c.outcome == "Failed"] == failing
    for name in failing:
        assert name in result.message


def test_failed_check_records_value_and_bound() -> None:
    """A ratio check's bound is computed from stable's value and kept in the result."""
    result = evaluate(scripted(p99=160.0), SPEC, TARGET)
    check = next(c for c in result.checks if c.name == "p99-latency-vs-stable")
    assert (check.value, check.max, check.outcome) == (160.0, 75.0, "Failed")
    assert "p99-latency-vs-stable 160 (wanted <= 75)" in result.message


def test_prometheus_down_is_inconclusive_without_queries() -> None:
    """An unreachable Prometheus is no verdict, never a pass, and nothing is queried."""
    source = scripted()
    source.online = False
    result = evaluate(source, SPEC, TARGET)
    assert (result.verdict, result.reason) == ("Inconclusive", "PrometheusDown")
    assert source.queries == []


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(requests_query(CANARY, "1m"), id="requests"),
        pytest.param(code_ratio_query(CANARY, "1m", SERVER_ERRORS), id="error-ratio"),
    ],
)
def test_query_error_is_inconclusive(broken: str) -> None:
    """A failed query is QueryError (not a failure, not NoData)."""
    source = scripted()
    source.failing.add(broken)
    result = evaluate(source, SPEC, TARGET)
    assert (result.verdict, result.reason) == ("Inconclusive", "QueryError")


def test_stable_error_ratio_for_fallback() -> None:
    """The fallback trigger reads stable's 5xx ratio; a failing Prometheus is no data."""
    query = code_ratio_query(STABLE, "1m", SERVER_ERRORS)
    assert analysis.read_stable_error_ratio(ScriptedMetricSource({query: 0.4}), STABLE, "1m") == 0.4
    failing = ScriptedMetricSource(failing={query})
    assert analysis.read_stable_error_ratio(failing, STABLE, "1m") is None


BOUNDED = {"name": "c", "query": 'c{m="$model",t="$track"}', "min": 1, "max": 2}
BOUNDED_QUERY = 'c{m="demo",t="canary"}'


def bounded_spec(**knobs: Any) -> AnalysisSpec:
    """SPEC with one custom check held between 1 and 2."""
    return AnalysisSpec.model_validate(
        {"prometheusUrl": "http://p:9090", "maxP99LatencyMs": 500, "checks": [BOUNDED]} | knobs
    )


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        pytest.param(1.0, "Passed", id="at-min"),
        pytest.param(2.0, "Passed", id="at-max"),
        pytest.param(0.5, "Failed", id="below"),
        pytest.param(2.5, "Failed", id="above"),
    ],
)
def test_bounds_are_inclusive(value: float, outcome: str) -> None:
    """A value on a bound passes; `$model` and `$track` name the canary's series."""
    source = scripted()
    source.values[BOUNDED_QUERY] = value
    result = evaluate(source, bounded_spec(), TARGET)
    check = next(c for c in result.checks if c.name == "c")
    assert (check.value, check.min, check.max, check.outcome) == (value, 1, 2, outcome)
    assert result.requests == 500


def test_failure_message_names_every_failed_check_and_both_bounds() -> None:
    """The message lists each failed check with its value and bounds, joined by '; '."""
    source = scripted(errors=0.2)
    source.values[BOUNDED_QUERY] = 3.0
    spec = bounded_spec(maxErrorRate=0.05)
    result = evaluate(source, spec, TARGET)
    assert result.verdict == "Failed"
    assert result.message == "error-rate 0.2 (wanted <= 0.05); c 3 (wanted >= 1 and <= 2)"


@pytest.mark.parametrize(
    ("failing", "outcome"),
    [
        pytest.param(True, "QueryError", id="query-error"),
        pytest.param(False, "NoData", id="no-data"),
    ],
)
def test_a_check_without_a_value_keeps_its_bounds(failing: bool, outcome: str) -> None:
    """A check with no value still records the bounds it would have been held to."""
    source = scripted()
    if failing:
        source.failing.add(BOUNDED_QUERY)
    result = evaluate(source, bounded_spec(), TARGET)
    check = next(c for c in result.checks if c.name == "c")
    assert (check.value, check.min, check.max, check.outcome) == (None, 1, 2, outcome)


@pytest.mark.parametrize(
    ("requests", "verdict", "message"),
    [
        pytest.param(20.0, "Passed", "", id="exactly-min-requests"),
        pytest.param(19.0, "Inconclusive", "19 canary requests in 1m, fewer than 20", id="fewer"),
        pytest.param(None, "Inconclusive", "0 canary requests in 1m, fewer than 20", id="none"),
    ],
)
def test_min_requests_is_enough_and_the_count_is_recorded(
    requests: float | None, verdict: str, message: str
) -> None:
    """`minRequests` requests give a verdict; fewer say how many there were."""
    result = evaluate(scripted(requests=requests), SPEC, TARGET)
    assert (result.verdict, result.requests) == (verdict, requests)
    if message:
        assert result.message == message


def test_target_compares_the_two_tracks_of_one_service() -> None:
    """Both scopes read this service's series; before any stable version, the stable's is ''."""
    spec = make_spec(model={"name": "enc", "version": "2", "uri": "builtin://synthetic"})
    target = target_for(spec, InferenceServiceStatus(canary_weight=5), namespace="team")
    assert target.canary == TrackScope("team", "enc", "2", Track.CANARY)
    assert target.stable == TrackScope("team", "enc", "", Track.STABLE)


@pytest.mark.parametrize(
    ("knob", "overrides", "check", "bound"),
    [
        pytest.param(
            "maxQueueWaitRatioVsStable",
            {"queue": 40.0, "stable_queue": 10.0},
            "queue-wait-p99-vs-stable",
            40.0,
            id="queue-wait",
        ),
        pytest.param(
            "maxRejectionRatioVsStable",
            {"rejections": 0.4, "stable_rejections": 0.1},
            "rejection-ratio-vs-stable",
            0.4,
            id="rejections",
        ),
    ],
)
def test_ratio_knobs_set_the_bound_against_stable(
    knob: str, overrides: dict[str, float], check: str, bound: float
) -> None:
    """A canary 4x stable fails the default ratio (2) and passes when the knob allows 4."""
    source = scripted(**overrides)
    assert evaluate(source, SPEC, TARGET).verdict == "Failed"
    relaxed = AnalysisSpec.model_validate(
        {"prometheusUrl": "http://p:9090", "mode": "threshold", "maxP99LatencyMs": 500, knob: 4}
    )
    result = evaluate(scripted(**overrides), relaxed, TARGET)
    outcome = next(c for c in result.checks if c.name == check)
    assert result.verdict == "Passed"
    assert outcome.max == pytest.approx(bound)


def test_a_lower_bound_alone_is_described_alone() -> None:
    """A check with only `min` says so, without an empty upper bound."""
    check = {"name": "warm", "query": "w", "min": 1}
    spec = AnalysisSpec.model_validate({"prometheusUrl": "http://p:9090", "checks": [check]})
    source = scripted()
    source.values["w"] = 0.0
    assert evaluate(source, spec, TARGET).message == "warm 0 (wanted >= 1)"


def test_inconclusive_results_say_why() -> None:
    """Prometheus down and a failed query each leave a readable message."""
    down = scripted()
    down.online = False
    assert evaluate(down, SPEC, TARGET).message == "Prometheus did not answer"
    broken = scripted()
    broken.failing.add(requests_query(CANARY, "1m"))
    message = evaluate(broken, SPEC, TARGET).message
    assert message == f"scripted failure: {requests_query(CANARY, '1m')}"
