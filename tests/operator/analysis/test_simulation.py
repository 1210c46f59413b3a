"""Seeded simulations of canaries judged by the operator's own tests (bench/analysis_bench.py).

A/A canaries (same error rate and latency distribution as stable) checked at every scrape
are rolled back at most α of the time; threshold mode, on the same draws, far more often
at small weights. A canary with twice stable's error rate, or a p99 half again stable's,
is caught, and the error regression at least three times sooner than threshold mode.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from bench.analysis_bench import (
    SPEC,
    Canary,
    RollbackTimes,
    Scenario,
    median_detection_s,
    rollback_rate,
    simulate,
)
from fleetserve_operator.analysis import accumulate
from fleetserve_operator.contract import LATENCY_BOUNDS_S
from fleetserve_operator.spec import Evidence, TrackCounts

A_A_CANARIES = 1000
RATE_RPS = 50.0
"""Total requests per second in the A/A runs: a 1% canary answers ~30 per minute."""


@cache
def _aa(weight: float) -> list[RollbackTimes]:
    return simulate(Scenario(weight=weight, rate_rps=RATE_RPS), A_A_CANARIES, seed=7)


@pytest.mark.parametrize("weight", [0.01, 0.05, 0.20])
def test_aa_canaries_checked_every_scrape_are_rolled_back_at_most_alpha(weight: float) -> None:
    """1000 A/A canaries, 10 minutes, tested at each 15 s scrape: false rollbacks ≤ α."""
    outcomes = _aa(weight)
    sequential, threshold = (rollback_rate(outcomes, m) for m in ("sequential", "threshold"))
    print(f"\nweight={weight:.0%} false_rollback sequential={sequential} threshold={threshold}")
    assert sequential <= SPEC.alpha


def test_threshold_mode_rolls_back_small_aa_canaries_on_noise() -> None:
    """The same 1% A/A canaries: fixed bounds on ~30 requests a minute fail on noise alone."""
    outcomes = _aa(0.01)
    sequential, threshold = (rollback_rate(outcomes, m) for m in ("sequential", "threshold"))
    assert threshold > 10 * max(sequential, SPEC.alpha / 10)


def test_a_doubled_error_rate_is_caught_three_times_sooner() -> None:
    """2x stable's 1% error rate at 5% of 500 requests/s: every canary caught, 3x faster."""
    scenario = Scenario(weight=0.05, rate_rps=500.0, horizon_s=1800.0, error_factor=2.0)
    outcomes = simulate(scenario, 100, seed=8)
    assert rollback_rate(outcomes, "sequential") == 1.0
    sequential = median_detection_s(outcomes, "sequential", scenario.horizon_s)
    threshold = median_detection_s(outcomes, "threshold", scenario.horizon_s)
    print(f"\nmedian_detection_s sequential={sequential} threshold={threshold}")
    assert 3 * sequential <= threshold


def test_a_tail_regression_is_caught_without_estimating_p99() -> None:
    """p99 +50% (only the slowest 2% slower) at 5%: the bucket counts give it away."""
    scenario = Scenario(weight=0.05, rate_rps=500.0, horizon_s=1800.0, tail_factor=1.5)
    outcomes = simulate(scenario, 100, seed=9)
    assert rollback_rate(outcomes, "sequential") == 1.0
    assert median_detection_s(outcomes, "sequential", scenario.horizon_s) <= 180


def test_aa_rollouts_through_the_operators_own_path_stay_valid_as_weights_change() -> None:
    """200 A/A rollouts at 1% → 5% → 20% → 50%, every scrape through `analysis.accumulate`.

    That is the operator's path: counters as Prometheus sums them, the evidence rounded as
    status keeps it, baselines carried from look to look, the traffic share changing.
    """
    rng = np.random.default_rng(11)
    rejected = 0
    for _ in range(200):
        totals = {track: [0, 0, [0] * (len(LATENCY_BOUNDS_S) + 1)] for track in ("c", "s")}
        evidence: Evidence | None = None
        for weight in (0.01, 0.05, 0.20, 0.50):
            draws = Canary(Scenario(weight=weight, rate_rps=RATE_RPS), rng)
            for _ in range(10):
                for track, canary in (("c", True), ("s", False)):
                    requests, errors, buckets = draws.scrape(canary=canary)
                    total = totals[track]
                    total[0] += requests
                    total[1] += errors
                    total[2] = [a + b for a, b in zip(total[2], buckets, strict=True)]
                counts = {
                    track: TrackCounts(requests=t[0], errors=t[1], latency_buckets=t[2])
                    for track, t in totals.items()
                }
                evidence = accumulate(SPEC, evidence, counts["c"], counts["s"])
        assert evidence is not None
        rejected += bool(evidence.rejected)
    assert rejected / 200 <= SPEC.alpha
