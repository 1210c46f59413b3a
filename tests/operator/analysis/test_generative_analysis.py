"""Canary analysis of generative models: per-token checks, the token gate, both modes.

Metric sources are scripted (threshold mode: one value per PromQL query) or fed seeded,
simulated counters (sequential mode: histograms of time to first token and inter-token
gaps drawn per look), so every verdict comes from the analysis code itself.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from fleetserve_operator.analysis import (
    ERROR_TEST,
    ITL,
    ITL_TEST,
    TTFT,
    TTFT_TEST,
    AnalysisTarget,
    TrackScope,
    accumulate,
    buckets_query,
    codes_query,
    evaluate,
    generated_query,
    per_request_query,
    plan_checks,
    target_for,
    tokens_per_replica_query,
    tokens_query,
    watch,
)
from fleetserve_operator.contract import (
    INTER_TOKEN_LATENCY_METRIC,
    PREEMPTIONS_METRIC,
    TIME_TO_FIRST_TOKEN_METRIC,
)
from fleetserve_operator.naming import Track
from fleetserve_operator.spec import (
    AnalysisSpec,
    CheckOutcome,
    Evidence,
    InconclusiveReason,
    InferenceServiceStatus,
    TrackCounts,
    Verdict,
)
from fleetserve_operator.testing import (
    RollingOut,
    ScriptedMetricSource,
    make_spec,
)
from tests.operator.analysis.window_answers import window_answers

CANARY = TrackScope("ns", "chat", "2", Track.CANARY)
STABLE = TrackScope("ns", "chat", "1", Track.STABLE)
TARGET = AnalysisTarget(CANARY, STABLE, "1m", generative=True)
THRESHOLD = AnalysisSpec(prometheus_url="http://prom:9090", mode="threshold")
SEQUENTIAL = AnalysisSpec(prometheus_url="http://prom:9090", min_requests=20, min_tokens=300)


# Threshold mode: one scripted value per query.


def scripted(**overrides: float | None) -> ScriptedMetricSource:
    """A healthy generative canary and stable (200 requests, 3000 tokens), with overrides."""
    figures: dict[str, float | None] = {
        "requests": 200.0,
        "tokens": 3000.0,
        "errors": 0.0,
        "rejections": 0.0,
        "stable_rejections": 0.0,
        "ttft": 300.0,
        "stable_ttft": 300.0,
        "itl": 40.0,
        "stable_itl": 40.0,
        "preemptions": 0.0,
        "tokens_per_replica": 50.0,
    }
    figures.update(overrides)
    w = TARGET.window
    p99s = {"ttft": TIME_TO_FIRST_TOKEN_METRIC, "itl": INTER_TOKEN_LATENCY_METRIC}
    values = window_answers(TARGET, figures, p99s) | {
        tokens_query(CANARY, w): figures["tokens"],
        per_request_query(PREEMPTIONS_METRIC, CANARY, w): figures["preemptions"],
        tokens_per_replica_query(CANARY, w): figures["tokens_per_replica"],
    }
    return ScriptedMetricSource(values=values)


def test_the_model_kind_chooses_the_checks() -> None:
    """A generative canary is judged per token; an encoder on request latency and queue wait."""
    spec = THRESHOLD.model_copy(update={"min_tokens_per_second_per_replica": 10.0})
    assert [c.name for c in plan_checks(spec, TARGET)] == [
        "error-rate",
        "ttft-p99-vs-stable",
        "itl-p99-vs-stable",
        "rejection-ratio-vs-stable",
        "ttft-p99",
        "itl-p99",
        "preemption-rate",
        "tokens-per-second-per-replica",
    ]
    encoder = [c.name for c in plan_checks(spec, replace(TARGET, generative=False))]
    assert encoder == [
        "error-rate",
        "p99-latency-vs-stable",
        "queue-wait-p99-vs-stable",
        "rejection-ratio-vs-stable",
    ]


def test_the_model_task_makes_the_target_generative() -> None:
    """`target_for` reads the task from the spec: the builtin's, or `model.task`."""
    status = InferenceServiceStatus(stable_version="1", canary_version="2")
    chat = make_spec(model={"name": "chat", "version": "2", "uri": "builtin://synthetic-generate"})
    llama = make_spec(
        model={"name": "chat", "version": "2", "uri": "file:///m/llama.gguf", "task": "generate"}
    )
    assert target_for(chat, status, namespace="ns").generative
    assert target_for(llama, status, namespace="ns").generative
    assert not target_for(make_spec(), status, namespace="ns").generative


def test_defaults_suit_chat_traffic() -> None:
    """TTFT within 2 s, a token every 200 ms at worst, 1.5x stable, 500 tokens per verdict."""
    spec = AnalysisSpec(prometheus_url="http://prom:9090")
    assert (spec.max_ttft_p99_ms, spec.max_itl_p99_ms) == (2000.0, 200.0)
    assert (spec.max_ttft_ratio_vs_stable, spec.max_itl_ratio_vs_stable) == (1.5, 1.5)
    assert (spec.min_tokens, spec.max_preemption_rate) == (500, 0.1)
    assert spec.min_tokens_per_second_per_replica is None
    wire = spec.model_dump(by_alias=True)
    assert {"maxTtftP99Ms", "maxItlP99Ms", "maxItlRatioVsStable", "minTokens"} <= set(wire)


def test_a_healthy_generative_canary_passes() -> None:
    """Every per-token check within bounds, enough requests and tokens: Passed."""
    result = evaluate(scripted(), THRESHOLD, TARGET)
    assert result.verdict is Verdict.PASSED, result.message
    assert (result.requests, result.tokens) == (200.0, 3000.0)


@pytest.mark.parametrize(
    ("overrides", "failing"),
    [
        pytest.param({"itl": 70.0}, {"itl-p99-vs-stable"}, id="itl-ratio"),
        pytest.param({"itl": 250.0, "stable_itl": 240.0}, {"itl-p99"}, id="itl-absolute"),
        pytest.param({"ttft": 600.0}, {"ttft-p99-vs-stable"}, id="ttft-ratio"),
        pytest.param({"ttft": 2500.0, "stable_ttft": 2400.0}, {"ttft-p99"}, id="ttft-absolute"),
        pytest.param({"errors": 0.05}, {"error-rate"}, id="errors"),
        pytest.param({"rejections": 0.05}, {"rejection-ratio-vs-stable"}, id="503-504"),
        pytest.param({"preemptions": 0.3}, {"preemption-rate"}, id="preemptions"),
        pytest.param({"tokens_per_replica": 5.0}, {"tokens-per-second-per-replica"}, id="tps"),
    ],
)
def test_each_generative_check_fails_a_regression(
    overrides: dict[str, float], failing: set[str]
) -> None:
    """A regression in one figure fails that check, and only it, naming it in the message."""
    spec = THRESHOLD.model_copy(update={"min_tokens_per_second_per_replica": 20.0})
    result = evaluate(scripted(**overrides), spec, TARGET)
    assert result.verdict is Verdict.FAILED
    failed = {c.name for c in result.checks if c.outcome is CheckOutcome.FAILED}
    assert failed == failing
    assert all(name in result.message for name in failing)


def test_an_itl_bound_is_milliseconds_against_stable() -> None:
    """The ratio check's bound is 1.5 x stable's p99 in ms, shown in the check."""
    result = evaluate(scripted(itl=70.0), THRESHOLD, TARGET)
    itl = next(c for c in result.checks if c.name == "itl-p99-vs-stable")
    assert (itl.value, itl.max) == (70.0, 60.0)


@pytest.mark.parametrize("tokens", [499.0, None])
def test_too_few_tokens_are_inconclusive_however_many_requests(tokens: float | None) -> None:
    """Many short answers are not enough: fewer than `minTokens` tokens is no verdict."""
    result = evaluate(scripted(tokens=tokens), THRESHOLD, TARGET)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reason is InconclusiveReason.TOO_FEW_TOKENS
    assert f"{tokens or 0:.0f} canary tokens in 1m, fewer than 500" in result.message
    assert evaluate(scripted(tokens=500.0), THRESHOLD, TARGET).verdict is Verdict.PASSED


def test_the_token_gate_is_for_generative_models_only() -> None:
    """An encoder's analysis never asks for tokens."""
    source = scripted(tokens=None)
    evaluate(source, THRESHOLD, replace(TARGET, generative=False))
    assert tokens_query(CANARY, "1m") not in source.queries


@pytest.mark.parametrize("missing", ["ttft", "stable_itl", "preemptions"])
def test_no_per_token_data_is_inconclusive_never_a_pass(missing: str) -> None:
    """A histogram without samples (NaN) or a missing series: NoData, not Passed."""
    result = evaluate(scripted(**{missing: math.nan}), THRESHOLD, TARGET)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reason is InconclusiveReason.NO_DATA


# Sequential mode: seeded, simulated counters.


@dataclass
class SimTrack:
    """One track's cumulative counters, grown by simulated streams."""

    ttft_ms: float
    itl_ms: float
    error_rate: float = 0.0
    tokens_per_answer: int = 16
    step_jitter: float = 0.0
    """σ of a log-normal factor shared by every latency of one look: the engine steps
    that all running streams of a track share run slower or faster together."""
    counts: TrackCounts = field(
        default_factory=lambda: TrackCounts(
            ttft_buckets=[0.0] * (len(TTFT.bounds) + 1),
            itl_buckets=[0.0] * (len(ITL.bounds) + 1),
        )
    )

    def serve(self, rng: random.Random, requests: int) -> TrackCounts:
        """Answer `requests` streams: log-normal TTFT and gaps around their medians."""
        ttft = list(self.counts.ttft_buckets)
        itl = list(self.counts.itl_buckets)
        errors = tokens = 0
        shared = rng.lognormvariate(0, self.step_jitter)
        for _ in range(requests):
            if rng.random() < self.error_rate:
                errors += 1
                continue
            _observe(ttft, TTFT.bounds, shared * self.ttft_ms * rng.lognormvariate(0, 0.3))
            for _ in range(self.tokens_per_answer - 1):
                _observe(itl, ITL.bounds, shared * self.itl_ms * rng.lognormvariate(0, 0.3))
            tokens += self.tokens_per_answer
        c = self.counts
        self.counts = c.model_copy(
            update={
                "requests": c.requests + requests,
                "errors": c.errors + errors,
                "tokens": c.tokens + tokens,
                "ttft_buckets": ttft,
                "itl_buckets": itl,
            }
        )
        return self.counts


def _observe(buckets: list[float], bounds: tuple[float, ...], ms: float) -> None:
    for i, bound in enumerate((*bounds, math.inf)):
        if ms / 1000 <= bound:
            buckets[i] += 1


def _rollout(
    seed: int,
    canary: SimTrack,
    stable: SimTrack,
    *,
    looks: int = 60,
    spec: AnalysisSpec = SEQUENTIAL,
) -> Evidence:
    """A 10% canary watched for `looks` looks, 20 requests each, until a test rejects."""
    rng = random.Random(seed)
    evidence = accumulate(SEQUENTIAL, None, canary.counts, stable.counts, generative=True)
    for _ in range(looks):
        served = sum(rng.random() < 0.1 for _ in range(20))
        evidence = accumulate(
            SEQUENTIAL,
            evidence,
            canary.serve(rng, served),
            stable.serve(rng, 20 - served),
            generative=True,
        )
        if evidence.rejected:
            break
    return evidence


def _checks(evidence: Evidence) -> dict[str, bool]:
    return {check.name: check.rejected for check in evidence.checks}


def test_generative_tests_are_errors_ttft_and_itl_and_their_bounds_at_a_seventh_of_alpha() -> None:
    """Three tests against stable, three absolute bounds and the baseline share α = 0.01.

    Each test rejects at e-value 700; there is no request-latency test.
    """
    evidence = accumulate(SEQUENTIAL, None, SimTrack(300, 40).counts, SimTrack(300, 40).counts,
                          generative=True)  # fmt: skip
    names = [ERROR_TEST, TTFT_TEST, ITL_TEST, "error-rate", "ttft-p99", "itl-p99"]
    assert [c.name for c in evidence.checks] == names
    assert {c.threshold for c in evidence.checks} == {700.0}
    assert [len(c.log_likelihood_ratios) for c in evidence.checks] == [6, 6 * 14, 6 * 15, 6, 6, 6]


@pytest.mark.parametrize("seed", range(5))
def test_an_inter_token_regression_is_rejected_by_the_itl_test(seed: int) -> None:
    """Gaps 40 → 80 ms with the same first-token time: the ITL test rejects, TTFT does not."""
    evidence = _rollout(seed, SimTrack(ttft_ms=300, itl_ms=80), SimTrack(ttft_ms=300, itl_ms=40))
    assert {name: _checks(evidence)[name] for name in (ERROR_TEST, TTFT_TEST, ITL_TEST)} == {
        ERROR_TEST: False,
        TTFT_TEST: False,
        ITL_TEST: True,
    }
    itl = next(c for c in evidence.checks if c.name == ITL_TEST)
    assert itl.e_value >= itl.threshold


@pytest.mark.parametrize("seed", range(5))
def test_a_first_token_regression_is_rejected_by_the_ttft_test(seed: int) -> None:
    """Prefill 300 → 900 ms with the same gaps: the TTFT test rejects."""
    evidence = _rollout(seed, SimTrack(ttft_ms=900, itl_ms=40), SimTrack(ttft_ms=300, itl_ms=40))
    assert _checks(evidence)[TTFT_TEST]
    assert not _checks(evidence)[ITL_TEST]


def test_failing_generation_requests_are_rejected_by_the_error_test() -> None:
    """Generation requests answered 5xx count in the error test as inference requests do."""
    evidence = _rollout(0, SimTrack(300, 40, error_rate=0.3), SimTrack(300, 40))
    assert _checks(evidence)[ERROR_TEST]


def test_identical_generative_canaries_are_not_rejected() -> None:
    """A/A: 40 seeded rollouts of 60 looks each; none is rejected by any test."""
    rejected = [
        seed for seed in range(40) if _rollout(seed, SimTrack(300, 40), SimTrack(300, 40)).rejected
    ]
    assert rejected == []


def test_gaps_that_share_engine_steps_do_not_reject_an_identical_canary() -> None:
    """A/A where each look's gaps of a track run 20% slower or faster together (σ 0.2).

    Taken as independent, those gaps would be hundreds of coin flips per look and reject
    about one rollout in four; weighed per request, none of 40 is rejected, and a real
    regression of 1.5x is still caught in every one.
    """

    def rollout(seed: int, itl_ms: float) -> Evidence:
        return _rollout(seed, SimTrack(300, itl_ms, step_jitter=0.2),
                        SimTrack(300, 40, step_jitter=0.2), looks=120)  # fmt: skip

    assert [seed for seed in range(40) if rollout(seed, 40).rejected] == []
    assert all(_checks(rollout(seed, 60))[ITL_TEST] for seed in range(10))


def test_tokens_of_the_step_are_counted() -> None:
    """`stepTokens` grows by the canary's tokens, so the gate can count them."""
    evidence = _rollout(1, SimTrack(300, 40, tokens_per_answer=10), SimTrack(300, 40), looks=20)
    assert evidence.step_tokens == 10 * evidence.step_samples > 0


def _source_for(
    canary: TrackCounts, stable: TrackCounts, *, histograms: bool = True
) -> ScriptedMetricSource:
    """Prometheus answering both tracks' counter queries with these counters."""
    source = ScriptedMetricSource()
    for scope, counts in ((CANARY, canary), (STABLE, stable)):
        source.vectors[codes_query(scope)] = {
            "200": counts.requests - counts.errors,
            "500": counts.errors,
        }
        for test, buckets in ((TTFT, counts.ttft_buckets), (ITL, counts.itl_buckets)):
            les = [*(repr(bound) for bound in test.bounds), "+Inf"]
            if histograms:
                source.vectors[buckets_query(scope, test)] = dict(zip(les, buckets, strict=True))
        source.values[generated_query(scope)] = counts.tokens
    return source


def _watched(canary: SimTrack, stable: SimTrack) -> Evidence:
    """Evidence after two looks through `watch`, reading the tracks' counters."""
    rng = random.Random(3)
    evidence = None
    for _ in range(2):
        source = _source_for(canary.serve(rng, 30), stable.serve(rng, 200))
        evidence, _ = watch(source, SEQUENTIAL, TARGET, evidence, due=False)
    assert evidence is not None
    return evidence


def test_a_step_with_too_few_tokens_is_inconclusive_at_the_interval_end() -> None:
    """60 requests pass the request gate; 60 one-token answers do not pass the token gate."""
    canary, stable = SimTrack(300, 40, tokens_per_answer=1), SimTrack(300, 40, tokens_per_answer=1)
    evidence = _watched(canary, stable)
    source = _source_for(canary.counts, stable.counts)
    _, result = watch(source, SEQUENTIAL, TARGET, evidence, due=True)
    assert result is not None
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reason is InconclusiveReason.TOO_FEW_TOKENS
    assert "60 canary tokens in this step, fewer than 300" in result.message


def test_a_healthy_step_passes_on_its_tests_and_bounds() -> None:
    """Enough requests and tokens, no rejection, bounds within: Passed.

    The TTFT and ITL p99 bounds are tests on the canary's own counts; the preemption bound is
    a window, whose failure fails the step.
    """
    canary, stable = SimTrack(300, 40), SimTrack(300, 40)
    evidence = _watched(canary, stable)
    source = _source_for(canary.counts, stable.counts)
    w = TARGET.window
    source.values[per_request_query(PREEMPTIONS_METRIC, CANARY, w)] = 0.0
    _, result = watch(source, SEQUENTIAL, TARGET, evidence, due=True)
    assert result is not None
    assert result.verdict is Verdict.PASSED, result.message
    assert result.tokens == evidence.step_tokens
    names = [c.name for c in result.checks]
    tests = [ERROR_TEST, TTFT_TEST, ITL_TEST, "error-rate", "ttft-p99", "itl-p99"]
    assert names == [*tests, "preemption-rate"], "the p99 bounds are tests, not windows"
    source.values[per_request_query(PREEMPTIONS_METRIC, CANARY, w)] = 0.5
    _, preempted = watch(source, SEQUENTIAL, TARGET, evidence, due=True)
    assert preempted is not None
    assert preempted.verdict is Verdict.FAILED
    assert "preemption-rate 0.5" in preempted.message


def test_without_per_token_histograms_a_step_is_inconclusive() -> None:
    """No TTFT/ITL series (a runtime without the engine's metrics): NoData, never a pass."""
    canary, stable = SimTrack(300, 40), SimTrack(300, 40)
    rng = random.Random(4)
    evidence = None
    for due in (False, False, True):
        source = _source_for(canary.serve(rng, 30), stable.serve(rng, 200), histograms=False)
        evidence, result = watch(source, SEQUENTIAL, TARGET, evidence, due=due)
    assert result is not None
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reason is InconclusiveReason.NO_DATA
    outcomes = {c.name: c.outcome for c in result.checks}
    assert outcomes[TTFT_TEST] is outcomes[ITL_TEST] is CheckOutcome.NO_DATA


# A whole reconcile: the Sync reads the model's task from the spec and judges per token.


def _chat_spec(version: str) -> dict[str, Any]:
    analysis_spec = {"prometheusUrl": "http://prom:9090", "minRequests": 20, "minTokens": 300}
    return {
        "model": {"name": "chat", "version": version, "uri": "builtin://synthetic-generate"},
        "rollout": {"steps": [20, 50, 100], "interval": "60s", "analysis": analysis_spec},
        "traffic": {"provider": "gateway-api", "parentRefs": [{"name": "gw"}],
                    "hostnames": ["chat.example.com"]},
    }  # fmt: skip


class _ChatRollout(RollingOut):
    """A generative InferenceService, rolling version 2 out at 20%."""

    def __init__(self) -> None:
        super().__init__(_chat_spec, name="chat")
        assert self.started.canary_weight == 20

    def look(self, rng: random.Random, canary: SimTrack, stable: SimTrack) -> None:
        """Both tracks serve for a second; Prometheus then answers with their counters."""
        source = _source_for(canary.serve(rng, 10), stable.serve(rng, 40))
        self.source.vectors = source.vectors
        self.source.values |= source.values


def test_the_sync_rolls_a_slower_generative_canary_back_on_itl() -> None:
    """Gaps 40 → 120 ms: the ITL test rejects within seconds, named in status."""
    rollout, rng = _ChatRollout(), random.Random(7)
    canary, stable = SimTrack(300, 120), SimTrack(300, 40)
    status = rollout.reconcile()
    for _ in range(20):
        rollout.look(rng, canary, stable)
        status = rollout.reconcile(after_s=1)
        if status.phase == "RolledBack":
            break
    assert (status.phase, status.canary_weight) == ("RolledBack", 0)
    assert "itl-vs-stable e-value" in status.rollout.message
    assert "canary token gaps" in status.rollout.message


def test_the_sync_promotes_a_good_generative_canary_and_counts_tokens_per_step() -> None:
    """A step passes on its tests, bounds and tokens; the next step counts tokens afresh."""
    rollout, rng = _ChatRollout(), random.Random(8)
    canary, stable = SimTrack(300, 40), SimTrack(300, 40)
    rollout.source.values[per_request_query(PREEMPTIONS_METRIC, CANARY, "60s")] = 0.0
    for _ in range(5):
        rollout.look(rng, canary, stable)
        status = rollout.reconcile(after_s=1)
    assert status.rollout.evidence is not None
    assert status.rollout.evidence.step_tokens == 16 * 50
    status = rollout.reconcile(after_s=60)
    assert status.canary_weight == 50
    passed = status.rollout.analyses[-1]
    assert passed.verdict is Verdict.PASSED
    assert passed.tokens == 16 * 50
    assert status.rollout.evidence is not None
    assert status.rollout.evidence.step_tokens == 0
