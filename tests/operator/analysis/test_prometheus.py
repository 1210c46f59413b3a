"""Prometheus over real HTTP on loopback: the URL allowlist, and what a failure may publish.

A fake Prometheus (`http.server` on 127.0.0.1) answers as scripted and records every request,
so the tests see what the operator really sends and what of the answer reaches its messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from pydantic import ValidationError

from fleetserve_operator.analysis import (
    AnalysisTarget,
    MetricSource,
    PrometheusSource,
    TrackScope,
    evaluate,
)
from fleetserve_operator.analysis.allowlist import PROMETHEUS_URL_FIELD, PrometheusAllowlist
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.settings import OperatorConfig
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import MESSAGE_LIMIT, InvalidSpec, MetricsUnavailable
from fleetserve_operator.naming import Track
from fleetserve_operator.spec import (
    AnalysisSpec,
    ConditionType,
    InconclusiveReason,
    RolloutPhase,
)
from fleetserve_operator.testing import FakeKube, QuietHandler, make_service, serve_http

SECRET = "do-not-publish-this-body"
TARGET = AnalysisTarget(
    TrackScope("ns", "demo", "2", Track.CANARY), TrackScope("ns", "demo", "1", Track.STABLE), "1m"
)


@dataclass
class Answer:
    """What the fake Prometheus sends: status, body, extra headers."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    reason: str | None = None


def vector(value: str) -> bytes:
    """An instant-query answer with one sample."""
    data = {"resultType": "vector", "result": [{"metric": {}, "value": [0, value]}]}
    return json.dumps({"status": "success", "data": data}).encode()


@dataclass
class FakePrometheus:
    """A loopback HTTP server answering every request with `answer` and recording its path."""

    answer: Answer = field(default_factory=Answer)
    requests: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # http.server's naming
            fake.requests.append(self.path)
            answer = fake.answer
            self.reply(answer.status, answer.body, answer.headers, reason=answer.reason)

    with serve_http(Handler) as url:
        fake.url = url
        yield fake


def test_a_value_is_read_from_a_real_answer(prometheus: FakePrometheus) -> None:
    """A vector's first sample is the value; the PromQL travels as the `query` parameter."""
    prometheus.answer = Answer(body=vector("0.25"))
    assert PrometheusSource(prometheus.url).query("up") == 0.25
    path = urlsplit(prometheus.requests[0])
    assert (path.path, parse_qs(path.query)) == ("/api/v1/query", {"query": ["up"]})


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        pytest.param(Answer(500, SECRET.encode(), reason=SECRET), "HTTP 500 Internal Server Error",
                     id="server-error"),
        pytest.param(Answer(400, json.dumps({"status": "error", "error": SECRET}).encode()),
                     "HTTP 400 Bad Request", id="bad-query"),
        pytest.param(Answer(599, SECRET.encode(), reason=SECRET), "HTTP 599", id="odd-status"),
        pytest.param(Answer(200, SECRET.encode()), "without an instant-query result",
                     id="not-json"),
        pytest.param(Answer(200, json.dumps({"data": SECRET}).encode()),
                     "without an instant-query result", id="not-a-result"),
    ],
)  # fmt: skip
def test_a_failure_says_the_status_never_the_body(
    prometheus: FakePrometheus, answer: Answer, reason: str
) -> None:
    """The status code and its standard phrase, or a fixed reason; nothing Prometheus sent."""
    prometheus.answer = answer
    with pytest.raises(MetricsUnavailable) as failed:
        PrometheusSource(prometheus.url).query("up")
    assert reason in str(failed.value)
    assert SECRET not in str(failed.value)


def test_a_redirect_is_not_followed(prometheus: FakePrometheus) -> None:
    """An allowed URL must not lead elsewhere: 302 is a failure, its target never asked."""
    prometheus.answer = Answer(302, headers={"Location": f"{prometheus.url}/elsewhere"})
    with pytest.raises(MetricsUnavailable, match="HTTP 302 Found"):
        PrometheusSource(prometheus.url).query("up")
    assert [urlsplit(path).path for path in prometheus.requests] == ["/api/v1/query"]


def test_an_oversized_body_is_refused(prometheus: FakePrometheus) -> None:
    """More than MAX_BODY_BYTES is a failure, not a value read from a truncated answer."""
    prometheus.answer = Answer(body=b" " * (PrometheusSource.MAX_BODY_BYTES + 1))
    with pytest.raises(MetricsUnavailable, match="more than"):
        PrometheusSource(prometheus.url).query("up")


def test_a_body_cut_short_is_a_failure(prometheus: FakePrometheus) -> None:
    """A connection closed mid-body (an error of urllib3, not of requests) is reported."""
    prometheus.answer = Answer(body=vector("1")[:10], headers={"Content-Length": "1000"})
    with pytest.raises(MetricsUnavailable, match="request failed"):
        PrometheusSource(prometheus.url).query("up")


def test_unreachable_prometheus_is_a_short_fixed_reason() -> None:
    """Connection refused: a fixed reason, and `is_online` False."""
    source = PrometheusSource("http://127.0.0.1:9")
    with pytest.raises(MetricsUnavailable, match="could not connect"):
        source.query("up")
    assert not source.is_online()


def test_the_ui_redirect_counts_as_online(prometheus: FakePrometheus) -> None:
    """Prometheus's `/` redirects to its UI; that answer means it is up."""
    prometheus.answer = Answer(302, headers={"Location": "/graph"})
    assert PrometheusSource(prometheus.url).is_online()


def test_analysis_message_is_bounded_and_holds_no_body(prometheus: FakePrometheus) -> None:
    """What reaches status: QueryError with the code, at most MESSAGE_LIMIT characters."""
    long_url = prometheus.url + "/" + "p" * 480  # near the schema's 512
    prometheus.answer = Answer(503, (SECRET * 1000).encode())
    spec = AnalysisSpec(prometheus_url=long_url)
    source = PrometheusSource(long_url)
    # Health check and query both get the 503; answer the health check as up.
    result = evaluate(_OnlineSource(source), spec, TARGET)
    assert result.reason is InconclusiveReason.QUERY_ERROR
    assert "HTTP 503 Service Unavailable" in result.message
    assert SECRET not in result.message
    assert len(result.message) <= MESSAGE_LIMIT


@dataclass
class _OnlineSource:
    """`source`, reporting itself online so that `evaluate` reaches the query."""

    source: PrometheusSource

    def query(self, promql: str) -> float | None:
        return self.source.query(promql)

    def is_online(self) -> bool:
        return True


ALLOWED = ["http://prometheus.monitoring:9090", "https://thanos.example.com/eu/"]


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus.monitoring:9090",
        "http://prometheus.monitoring:9090/",
        "http://PROMETHEUS.monitoring:9090/sub/path",
        "https://thanos.example.com/eu",
        "https://thanos.example.com:443/eu/west",
    ],
)
def test_allowed_urls(url: str) -> None:
    """Same scheme, host (any case) and port (defaulted), path at or below an entry's."""
    PrometheusAllowlist(ALLOWED).check(url)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://prometheus.monitoring:9091", id="other-port"),
        pytest.param("https://prometheus.monitoring:9090", id="other-scheme"),
        pytest.param("http://prometheus.monitoring", id="default-port-is-80"),
        pytest.param("http://prometheus.monitoring:9090@evil.example", id="userinfo-trick"),
        pytest.param("http://user:pw@prometheus.monitoring:9090", id="credentials"),
        pytest.param("https://thanos.example.com/europe", id="path-prefix-not-a-segment"),
        pytest.param("https://thanos.example.com/eu/../admin", id="dot-segments"),
        pytest.param("https://thanos.example.com/eu/%2e%2e/admin", id="escaped-dots"),
        pytest.param("https://thanos.example.com/eu?x=1", id="query"),
        pytest.param("http://prometheus.monitoring:99999", id="bad-port"),
        pytest.param("http://[::1", id="bad-ipv6"),
        pytest.param("http://metadata.internal/", id="elsewhere"),
    ],
)
def test_refused_urls_name_the_field(url: str) -> None:
    """Anything else is an InvalidSpec naming spec.rollout.analysis.prometheusUrl."""
    with pytest.raises(InvalidSpec) as refused:
        PrometheusAllowlist(ALLOWED).check(url)
    assert refused.value.field == PROMETHEUS_URL_FIELD


def test_a_refused_url_is_never_contacted(prometheus: FakePrometheus) -> None:
    """The operator builds its sources through the allowlist: no request leaves for it."""
    allowlist = PrometheusAllowlist(["http://127.0.0.1:9"])
    with pytest.raises(InvalidSpec):
        allowlist.source(prometheus.url)
    assert prometheus.requests == []
    prometheus.answer = Answer(body=vector("1"))
    assert PrometheusAllowlist([prometheus.url]).source(prometheus.url).query("up") == 1.0


def test_operator_config_allows_its_own_url_and_the_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`FLEETSERVE_ALLOWED_PROMETHEUS_URLS` (JSON) plus `FLEETSERVE_PROMETHEUS_URL`."""
    monkeypatch.setenv("FLEETSERVE_ALLOWED_PROMETHEUS_URLS", json.dumps(["http://a:9090"]))
    monkeypatch.setenv("FLEETSERVE_PROMETHEUS_URL", "http://b:9090")
    allowlist = OperatorConfig().prometheus_allowlist
    allowlist.check("http://a:9090")
    allowlist.check("http://b:9090/")
    with pytest.raises(InvalidSpec):
        allowlist.check("http://c:9090")


def test_an_empty_allowlist_allows_only_the_operators_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a list, a spec may name only `prometheus_url`; without that, nothing."""
    monkeypatch.delenv("FLEETSERVE_ALLOWED_PROMETHEUS_URLS", raising=False)
    monkeypatch.delenv("FLEETSERVE_PROMETHEUS_URL", raising=False)
    with pytest.raises(InvalidSpec):
        OperatorConfig().prometheus_allowlist.check("http://b:9090")
    monkeypatch.setenv("FLEETSERVE_PROMETHEUS_URL", "http://b:9090")
    OperatorConfig().prometheus_allowlist.check("http://b:9090")


@pytest.mark.parametrize(
    "entry", ["ftp://a", "http://u:p@a:9090", "http://a:9090/?q=1", "not a url"]
)
def test_a_bad_allowlist_entry_stops_start_up(monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """The operator refuses to start on an entry it could not match safely."""
    monkeypatch.setenv("FLEETSERVE_ALLOWED_PROMETHEUS_URLS", json.dumps([entry]))
    with pytest.raises(ValidationError, match="allowed_prometheus_urls"):
        OperatorConfig()


def _analysed_service(url: str) -> dict[str, Any]:
    model = {"name": "demo", "version": "1", "uri": "builtin://synthetic"}
    return make_service({"model": model, "rollout": {"analysis": {"prometheusUrl": url}}})


def _never_queried(url: str) -> MetricSource:
    raise AssertionError(f"{url} was to be queried")


def _allowlisted_sync(prometheus_url: str) -> tuple[FakeKube, Sync]:
    """A service analysed on `prometheus_url`, and a Sync holding the test allowlist."""
    kube = FakeKube()
    kube.add_service(_analysed_service(prometheus_url))
    sync = Sync(
        kube,
        metrics=OperatorMetrics(),
        prometheus_allowlist=PrometheusAllowlist(ALLOWED),
        metric_source=_never_queried,
    )
    return kube, sync


def test_a_url_outside_the_allowlist_is_invalid_when_the_spec_is_parsed() -> None:
    """First reconcile, no rollout, no memory check due: InvalidSpec naming the field at once.

    Nothing is created and no metric source is made for the URL.
    """
    kube, sync = _allowlisted_sync("http://metadata.internal/")
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert isinstance(error, InvalidSpec)
    assert error.field == PROMETHEUS_URL_FIELD
    assert [action for action, _, _ in kube.writes] == ["status"]
    status = kube.status_of("ns", "demo")
    degraded = status.condition(ConditionType.DEGRADED)
    assert degraded is not None
    assert (degraded.status, degraded.reason) == ("True", "InvalidSpec")
    assert PROMETHEUS_URL_FIELD in degraded.message
    assert status.phase is RolloutPhase.FAILED


def test_an_allowlisted_url_passes_the_parse() -> None:
    """The same service naming an allowed URL deploys (and is not queried before it is due)."""
    kube, sync = _allowlisted_sync("http://prometheus.monitoring:9090/")
    assert sync.run_by_name("ns", "demo", trigger="create") is None
    assert ("create", "Deployment", "demo-stable") in kube.writes
