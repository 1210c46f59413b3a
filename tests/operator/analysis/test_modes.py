"""Every field of `spec.rollout.analysis` is applied in the modes that declare it.

A field a mode cannot honour is refused there.

Each field is changed from its default and the mode's own code path is asked what it would
judge: sequential mode's tests, bounds, gate and windows (`sequential_plan`,
`window_checks`, the step's verdict), threshold mode's planned checks and verdict
(`plan_checks`, `evaluate`). A field a mode declares must change that answer; a field only
the other mode uses is refused by the model and by a CEL rule of the CRD.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator.analysis import (
    AnalysisTarget,
    TrackScope,
    evaluate,
    plan_checks,
    requests_query,
    sequential_plan,
    tokens_query,
)
from fleetserve_operator.analysis.sequential import judged_at_interval_end, window_checks
from fleetserve_operator.crdgen import build_crd
from fleetserve_operator.naming import Track
from fleetserve_operator.spec import AnalysisMode, AnalysisSpec, Evidence
from fleetserve_operator.testing import ScriptedMetricSource

SEQ, THR = AnalysisMode.SEQUENTIAL, AnalysisMode.THRESHOLD
CANARY = TrackScope("ns", "demo", "2", Track.CANARY)
STABLE = TrackScope("ns", "demo", "1", Track.STABLE)

# field: (the modes that use it, a value other than its default, generative model or not)
FIELDS: dict[str, tuple[frozenset[AnalysisMode], Any, bool]] = {
    "alpha": (frozenset({SEQ}), 0.05, False),
    "errorTolerance": (frozenset({SEQ}), 0.5, False),
    "latencyTolerance": (frozenset({SEQ}), 1.0, False),
    "minDetectableRatio": (frozenset({SEQ}), 3.0, False),
    "power": (frozenset({SEQ}), 0.8, False),
    "maxLatencyRatioVsStable": (frozenset({THR}), 3.0, False),
    "maxQueueWaitRatioVsStable": (frozenset({THR}), 3.0, False),
    "maxRejectionRatioVsStable": (frozenset({THR}), 3.0, False),
    "maxTtftRatioVsStable": (frozenset({THR}), 3.0, True),
    "maxItlRatioVsStable": (frozenset({THR}), 3.0, True),
    "maxErrorRate": (frozenset({SEQ, THR}), 0.05, False),
    "maxP99LatencyMs": (frozenset({SEQ, THR}), 400.0, False),
    "maxTtftP99Ms": (frozenset({SEQ, THR}), 1000.0, True),
    "maxItlP99Ms": (frozenset({SEQ, THR}), 100.0, True),
    "maxPreemptionRate": (frozenset({SEQ, THR}), 0.5, True),
    "minTokensPerSecondPerReplica": (frozenset({SEQ, THR}), 10.0, True),
    "minRequests": (frozenset({SEQ, THR}), 50, False),
    "minTokens": (frozenset({SEQ, THR}), 1000, True),
}
ROLLOUT_WIDE = {
    "mode",
    "prometheusUrl",
    "window",
    "failureThreshold",
    "inconclusiveThreshold",
    "historyLimit",
    "checks",
}
"""Read alike in both modes: where and over what range to query, and what the rollout makes of
the verdicts (tests/operator/rollout, test_threshold.py, test_sequential.py)."""


def _spec(mode: AnalysisMode, **fields: Any) -> AnalysisSpec:
    return AnalysisSpec.model_validate({"prometheusUrl": "http://p:9090", "mode": mode, **fields})


def _few_samples() -> ScriptedMetricSource:
    """30 canary requests and 600 tokens in the window: between the defaults and the values."""
    return ScriptedMetricSource(
        values={requests_query(CANARY, "1m"): 30.0, tokens_query(CANARY, "1m"): 600.0}
    )


def _sequential(spec: AnalysisSpec, generative: bool) -> Any:
    """What sequential mode judges: its tests, bounds, gate, windows and a thin step's verdict."""
    target = AnalysisTarget(CANARY, STABLE, "1m", generative=generative)
    plan = sequential_plan(spec, generative=generative)
    thin = Evidence(step_samples=30, step_tokens=600)
    return (
        {name: (test.tolerance, test.threshold) for name, test in plan.tests.items()},
        {name: (g.test.rate, g.test.threshold, g.index) for name, g in plan.guardrails.items()},
        (plan.gate.ratio, plan.gate.beta),
        [(c.name, c.min, c.max) for c in window_checks(spec, target)],
        judged_at_interval_end(ScriptedMetricSource(), spec, target, thin).message,
    )


def _threshold(spec: AnalysisSpec, generative: bool) -> Any:
    """What threshold mode judges: its planned checks and a thin window's verdict."""
    target = AnalysisTarget(CANARY, STABLE, "1m", generative=generative)
    planned = [(c.name, c.min, c.max, c.factor, c.floor) for c in plan_checks(spec, target)]
    return planned, evaluate(_few_samples(), spec, target).message


PROBES = {SEQ: _sequential, THR: _threshold}


def test_every_field_is_declared_for_its_modes() -> None:
    """A new field must say which mode applies it (and get its probe here)."""
    wire = {field.alias for field in AnalysisSpec.model_fields.values()}
    assert set(FIELDS) | ROLLOUT_WIDE == wire


@pytest.mark.parametrize(
    ("field", "mode"),
    [(field, mode) for field, (modes, _, _) in FIELDS.items() for mode in sorted(modes)],
)
def test_a_field_is_applied_in_each_mode_that_declares_it(field: str, mode: AnalysisMode) -> None:
    """Changing the field changes what the mode judges."""
    _, value, generative = FIELDS[field]
    probe = PROBES[mode]
    assert probe(_spec(mode, **{field: value}), generative) != probe(_spec(mode), generative)


ONE_MODE = [(field, modes) for field, (modes, _, _) in FIELDS.items() if len(modes) == 1]


@pytest.mark.parametrize(("field", "modes"), ONE_MODE, ids=[field for field, _ in ONE_MODE])
def test_a_field_of_one_mode_is_refused_in_the_other(
    field: str, modes: frozenset[AnalysisMode]
) -> None:
    """Set away from its default in the other mode, it is refused, by the model and the CRD.

    The model says why; the CRD carries the CEL rule that makes the API server do the same.
    At its default (which the API server fills in) it is accepted.
    """
    (own,) = modes
    other = THR if own is SEQ else SEQ
    _, value, _ = FIELDS[field]
    with pytest.raises(ValidationError, match=f"analysis.{field} is used in {own} mode only"):
        _spec(other, **{field: value})
    default = AnalysisSpec.model_fields[next(
        name for name, info in AnalysisSpec.model_fields.items() if info.alias == field
    )].default  # fmt: skip
    assert _spec(other, **{field: default}).mode is other
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    analysis = schema["properties"]["spec"]["properties"]["rollout"]["properties"]["analysis"]
    rules = {rule["fieldPath"]: rule for rule in analysis["x-kubernetes-validations"]}
    assert rules[f".{field}"]["rule"] == (
        f"self.mode == '{own}' || !has(self.{field}) || self.{field} == {float(default)!r}"
    )


@pytest.mark.parametrize(
    ("field", "limit"),
    [("maxP99LatencyMs", 30_000), ("maxTtftP99Ms", 30_000), ("maxItlP99Ms", 2_500)],
)
def test_a_p99_bound_above_the_histograms_last_bucket_is_refused(field: str, limit: float) -> None:
    """No mode can measure a p99 above the last bucket bound: the bound is refused there."""
    assert _spec(SEQ, **{field: limit}).mode is SEQ
    with pytest.raises(ValidationError, match="less than or equal to"):
        _spec(SEQ, **{field: limit + 1})
