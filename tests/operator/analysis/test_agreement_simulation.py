"""Seeded simulations of shadow stages: the judgement's level and power.

Each run looks every 50 compared units (and 50 copies) for up to 60 looks; units disagree,
and copies fail, independently at the run's true rates. A shadow exactly at the bounds
fails at most α of the time and passes at most β = 1 - power of the time; one clearly
inside them passes, one clearly outside fails.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from fleetserve_operator.analysis.agreement import ShadowCounts, ShadowPolicy, look
from fleetserve_operator.spec import Verdict

POLICY = ShadowPolicy(min_agreement=0.95, max_error_rate=0.01, alpha=0.05, power=0.9)
RUNS = 300
LOOKS = 60
PER_LOOK = 50


def outcomes(disagreement: float, error_rate: float, seed: int) -> Counter[Verdict]:
    """The verdict each run ends on: the first Failed or Passed, else Inconclusive."""
    rng = np.random.default_rng(seed)
    ends: Counter[Verdict] = Counter()
    for _ in range(RUNS):
        evidence = None
        mirrored = errors = compared = agreed = 0.0
        end = Verdict.INCONCLUSIVE
        for _ in range(LOOKS):
            mirrored += PER_LOOK
            errors += rng.binomial(PER_LOOK, error_rate)
            compared += PER_LOOK
            agreed += PER_LOOK - rng.binomial(PER_LOOK, disagreement)
            counts = ShadowCounts(
                mirrored=mirrored, errors=errors, compared=compared, agreed=agreed
            )
            evidence, verdict = look(POLICY, evidence, counts)
            if verdict.verdict is not Verdict.INCONCLUSIVE:
                end = verdict.verdict
                break
        ends[end] += 1
    return ends


def test_a_shadow_at_the_agreement_bound_fails_at_most_alpha_and_passes_at_most_beta() -> None:
    ends = outcomes(disagreement=0.05, error_rate=0.0, seed=1)
    assert ends[Verdict.FAILED] / RUNS <= POLICY.alpha
    assert ends[Verdict.PASSED] / RUNS <= 1 - POLICY.power


def test_a_shadow_at_the_error_bound_fails_at_most_alpha_and_passes_at_most_beta() -> None:
    ends = outcomes(disagreement=0.0, error_rate=0.01, seed=2)
    assert ends[Verdict.FAILED] / RUNS <= POLICY.alpha
    assert ends[Verdict.PASSED] / RUNS <= 1 - POLICY.power


def test_a_shadow_well_within_both_bounds_passes() -> None:
    ends = outcomes(disagreement=0.01, error_rate=0.001, seed=3)
    assert ends[Verdict.PASSED] / RUNS >= POLICY.power


def test_a_shadow_that_disagrees_or_fails_often_fails() -> None:
    assert outcomes(disagreement=0.12, error_rate=0.0, seed=4)[Verdict.FAILED] / RUNS >= 0.9
    assert outcomes(disagreement=0.0, error_rate=0.04, seed=5)[Verdict.FAILED] / RUNS >= 0.9
