"""The power gate, the absolute bounds' tests and their arithmetic.

`analysis.power`, `guardrails` and `rates`: valid bets under their hypotheses, and the sample
size a gate needs.
"""

from __future__ import annotations

import math
import random

import pytest

from fleetserve_operator.analysis.guardrails import BoundTest, bound_index
from fleetserve_operator.analysis.power import ALTERNATIVES, FLOOR, PowerGate, TrackSample
from fleetserve_operator.analysis.rates import (
    LOG_CAP,
    bernoulli_log_ratio,
    fnch_log_ratio,
    lower_bound,
    odds_scaled,
    upper_bound,
)

GATE = PowerGate(ratio=2.0, beta=0.1)


def _fisher_pmf(x: int, n_c: int, n_s: int, psi: float) -> dict[int, float]:
    """Fisher's noncentral hypergeometric law of the canary's share of `x` events."""
    support = range(max(0, x - n_s), min(x, n_c) + 1)
    weights = {u: math.comb(n_c, u) * math.comb(n_s, x - u) * psi**u for u in support}
    total = sum(weights.values())
    return {u: w / total for u, w in weights.items()}


@pytest.mark.parametrize(("n_c", "n_s"), [(1, 20), (5, 95), (20, 80), (30, 30), (3, 3), (40, 10)])
@pytest.mark.parametrize("ratio", [1.5, 2.0, 5.0])
def test_the_share_is_a_fair_bet_against_a_canary_ratio_times_worse(
    n_c: int, n_s: int, ratio: float
) -> None:
    """E[exp(score)] ≤ 1 at every odds ratio ψ ≥ R, for any count of events, exactly.

    The binomial score of the rejection tests would not be: at ψ0 > 1 the exact law puts the
    canary's share below the binomial's mean, which a bet on fewer canary events wins.
    """
    for psi in (ratio, 1.5 * ratio, 4 * ratio):
        for x in range(1, n_c + n_s):
            law = _fisher_pmf(x, n_c, n_s, psi)
            for g in ALTERNATIVES:
                expectation = sum(
                    p * math.exp(fnch_log_ratio(k, x, n_c, n_s, ratio / g, ratio))
                    for k, p in law.items()
                )
                assert expectation <= 1 + 1e-9, (psi, x, g, expectation)


def _binomial_pmf(k: int, n: int, rate: float) -> float:
    log_comb = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return math.exp(log_comb + k * math.log(rate) + (n - k) * math.log(1 - rate))


@pytest.mark.parametrize("n", [20, 200, 2000])
@pytest.mark.parametrize("delta", [0.1, 0.001])
def test_the_confidence_bounds_hold_with_probability_one_minus_delta(n: int, delta: float) -> None:
    """Exactly, over the binomial law: the true rate lies outside a bound at most δ of the time.

    Above the upper bound, or below the lower one.
    """
    uppers = [upper_bound(k, n, delta) for k in range(n + 1)]
    lowers = [lower_bound(k, n, delta) for k in range(n + 1)]
    for rate in (0.001, 0.01, 0.05, 0.3):
        law = [_binomial_pmf(k, n, rate) for k in range(n + 1)]
        assert sum(p for p, up in zip(law, uppers, strict=True) if up < rate) <= delta
        assert sum(p for p, low in zip(law, lowers, strict=True) if low > rate) <= delta
    assert uppers[0] > 0 == lowers[0]
    assert lowers[n] < 1 == uppers[n]


def test_an_event_impossible_under_the_null_is_the_largest_evidence() -> None:
    """Rate 0 and an event: the capped log-ratio; a factor both rates share adds nothing."""
    assert bernoulli_log_ratio(1, 10, 0.1, 0.0) == LOG_CAP
    assert bernoulli_log_ratio(0, 10, 0.0, 0.1) == pytest.approx(10 * math.log(1 / 0.9))
    assert bernoulli_log_ratio(3, 10, 0.2, 0.2) == 0.0
    assert odds_scaled(0.5, 3) == pytest.approx(0.75)
    assert (odds_scaled(0.0, 3), odds_scaled(1.0, 3)) == (0.0, 1.0)


def _clearing(
    rng: random.Random, canary_rate: float, stable_rate: float, *, per_look: int, looks: int
) -> float | None:
    """Canary requests at which the gate cleared (a 50% split), or None within `looks`."""
    state = GATE.start()
    for look in range(1, looks + 1):
        k = sum(rng.random() < canary_rate for _ in range(per_look))
        m = sum(rng.random() < stable_rate for _ in range(per_look))
        state = GATE.update(state, TrackSample(per_look, k), TrackSample(per_look, m))
        if GATE.e_value(state) >= GATE.threshold:
            return float(look * per_look)
    return None


def test_an_aa_canary_clears_at_about_the_samples_needed() -> None:
    """1% errors on both tracks, half the traffic each: cleared near the projected sample size.

    The median over 40 seeded canaries, against the projection before any data.
    """
    projected = GATE.samples_needed(GATE.start(), 0.0, 0.01, 1.0)
    assert projected is not None
    rng = random.Random(3)
    cleared = [_clearing(rng, 0.01, 0.01, per_look=100, looks=100) for _ in range(40)]
    times = sorted(c for c in cleared if c is not None)
    assert len(times) == 40
    median = times[len(times) // 2]
    print(f"\nprojected={projected:.0f} median={median:.0f}")
    assert 0.5 * projected <= median <= 1.5 * projected


def test_a_canary_at_the_detectable_ratio_clears_at_most_beta_of_the_time() -> None:
    """Twice stable's odds of 1% (the hypothesis's edge): 200 canaries, 10,000 requests each.

    Cleared means promoted; it happens to at most 0.9·β of them, however long they run.
    """
    rng = random.Random(5)
    worse = odds_scaled(0.01, 2.0)
    runs = [_clearing(rng, worse, 0.01, per_look=100, looks=100) for _ in range(200)]
    cleared = sum(run is not None for run in runs) / len(runs)
    print(f"\ncleared={cleared}")
    assert cleared <= GATE.beta


def test_without_events_the_floor_clears_and_a_failing_canary_never_does() -> None:
    """Neither track fails: a few hundred canary requests rule out 2x the odds of 1%.

    A canary failing 3% over a stable that fails nothing never clears: the share has
    every event against it, and its own rate is above the floor's bound.
    """
    state, seen = GATE.start(), 0
    while GATE.e_value(state) < GATE.threshold:
        state = GATE.update(state, TrackSample(10, 0), TrackSample(10, 0))
        seen += 10
    assert FLOOR == 0.01
    assert 150 <= seen <= 400
    failing = GATE.start()
    for _ in range(2000):
        failing = GATE.update(failing, TrackSample(100, 3), TrackSample(100, 0))
    assert GATE.e_value(failing) < 1


def test_without_stable_traffic_the_gate_clears_against_the_baseline() -> None:
    """The 100% step: a canary like stable's baseline (1%) clears; one at 5% does not."""
    baseline = TrackSample(100_000, 1_000)
    like, worse = GATE.start(), GATE.start()
    for _ in range(200):
        like = GATE.update_vs_baseline(like, TrackSample(100, 1), baseline)
        worse = GATE.update_vs_baseline(worse, TrackSample(100, 5), baseline)
    assert GATE.e_value(like) >= GATE.threshold
    assert GATE.e_value(worse) < 1


def test_samples_needed_shrinks_with_evidence_and_needs_a_rate() -> None:
    """The projection: fewer requests to go once some evidence is in; none without a rate."""
    fresh = GATE.samples_needed(GATE.start(), 0.0, 0.01, 1.0)
    state = GATE.update(GATE.start(), TrackSample(500, 5), TrackSample(500, 5))
    later = GATE.samples_needed(state, 500.0, 0.01, 1.0)
    assert fresh is not None
    assert later is not None
    assert later - 500 < fresh
    assert GATE.samples_needed(GATE.start(), 0.0, None, 1.0) is None
    assert GATE.threshold == pytest.approx(1 / 0.09)


def test_a_bound_of_zero_rejects_at_the_first_event() -> None:
    """`maxErrorRate: 0`: no 5xx can happen under it, so the first one decides."""
    test = BoundTest(rate=0.0, alpha=0.005)
    clean = test.update(test.start(), 0, 1000)
    assert test.e_value(clean) == 1.0
    assert test.e_value(test.update(clean, 1, 10)) >= test.threshold


def test_a_canary_above_its_bound_is_rejected_and_one_at_it_rarely_is() -> None:
    """3% errors against `maxErrorRate: 0.02` rejects; exactly 2% rarely does.

    200 canaries at 2%, 5,000 requests each, are rejected at most α of the time.
    """
    test = BoundTest(rate=0.02, alpha=0.05)
    rng = random.Random(9)

    def rejected(rate: float) -> bool:
        state = test.start()
        for _ in range(50):
            state = test.update(state, sum(rng.random() < rate for _ in range(100)), 100)
            if test.e_value(state) >= test.threshold:
                return True
        return False

    assert rejected(0.03)
    at_bound = sum(rejected(0.02) for _ in range(200)) / 200
    assert at_bound <= test.alpha


def test_a_p99_bound_is_judged_at_the_first_bucket_bound_at_or_above_it() -> None:
    """Fewer answers are slower than the bucket bound above: a rejection there is still one."""
    bounds = (0.01, 0.025, 0.05, 0.1)
    assert bound_index(bounds, 0.025) == 1
    assert bound_index(bounds, 0.03) == 2
    with pytest.raises(ValueError, match="above the histogram's last bound"):
        bound_index(bounds, 0.2)
