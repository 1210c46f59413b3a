"""The anytime-valid count tests (`analysis.count_tests`): validity and evidence."""

from __future__ import annotations

import math

import pytest

from fleetserve_operator.analysis.count_tests import (
    ALTERNATIVES,
    CountTest,
    Increment,
    e_value,
    exceedances,
)


def _fisher_pmf(k: int, x: int, n_c: int, n_s: int, psi: float) -> float:
    """Fisher's noncentral hypergeometric law of the canary's share `k` of `x` events."""
    support = range(max(0, x - n_s), min(x, n_c) + 1)
    weights = {u: math.comb(n_c, u) * math.comb(n_s, x - u) * psi**u for u in support}
    return weights.get(k, 0.0) / sum(weights.values())


@pytest.mark.parametrize(("n_c", "n_s"), [(1, 20), (5, 95), (20, 80), (50, 50), (3, 3), (12, 2)])
@pytest.mark.parametrize("tolerance", [0.0, 0.1, 0.5, 1.0])
def test_one_increment_is_a_fair_bet_under_the_null(n_c: int, n_s: int, tolerance: float) -> None:
    """E[exp(score)] ≤ 1 at the null's bound, for any count of events, under the exact law.

    The law is Fisher's noncentral hypergeometric, not the binomial the score is built from.
    """
    test = CountTest(tolerance=tolerance, alpha=0.01)
    psi0 = 1 + tolerance
    for x in range(1, n_c + n_s + 1):
        for j in range(len(ALTERNATIVES)):
            expectation = 0.0
            for k in range(max(0, x - n_s), min(x, n_c) + 1):
                score = test.update(test.start(), Increment(n_c, n_s, (k,), (x - k,)))[j]
                expectation += _fisher_pmf(k, x, n_c, n_s, psi0) * math.exp(score)
            assert expectation <= 1 + 1e-9, (x, ALTERNATIVES[j], expectation)


def test_the_e_value_is_the_mixture_average() -> None:
    """Equal weights over the components; 1 before any data."""
    assert e_value([]) == 1.0
    assert e_value([0.0, 0.0]) == 1.0
    assert e_value([math.log(3), math.log(5)]) == pytest.approx(4.0)
    assert e_value([1000.0]) == math.exp(700.0)


def test_errors_only_on_the_canary_reject_within_a_few() -> None:
    """At a 20% share, canary errors with none on stable are strong evidence: a handful rejects."""
    test = CountTest(tolerance=0.0, alpha=0.005)
    state = test.start()
    needed = 0
    while not test.rejects(state):
        state = test.update(state, Increment(20, 80, (1,), (0,)))
        needed += 1
    assert needed <= 6
    assert test.e_value(state) >= test.threshold == 200


def test_errors_in_proportion_to_traffic_build_no_evidence() -> None:
    """The canary's share of errors equal to its share of requests: the e-value falls."""
    test = CountTest(tolerance=0.0, alpha=0.005)
    state = test.start()
    for _ in range(50):
        state = test.update(state, Increment(100, 400, (2,), (8,)))
    assert test.e_value(state) < 1.0
    assert not test.rejects(state)


def test_the_traffic_share_of_each_increment_is_used() -> None:
    """The same errors count against the canary only when it had less of the traffic."""
    test = CountTest(tolerance=0.0, alpha=0.005)
    fair = test.update(test.start(), Increment(50, 50, (5,), (5,)))
    unfair = test.update(test.start(), Increment(10, 90, (5,), (5,)))
    assert test.e_value(fair) < 1.0 < test.e_value(unfair)


def test_an_increment_without_both_tracks_changes_nothing() -> None:
    """No stable requests (the 100% step): no share, no evidence either way."""
    test = CountTest(tolerance=0.0, alpha=0.005)
    state = test.update(test.start(), Increment(30, 0, (30,), (0,)))
    assert state == test.start()


def test_latency_events_are_answers_slower_than_each_bound() -> None:
    """Cumulative buckets (bounds, then +Inf) → exceedances per bound."""
    assert exceedances([1, 4, 10, 12]) == (11, 8, 2)


def test_a_state_of_the_wrong_size_is_refused() -> None:
    """A state kept for another number of series cannot silently mix up components."""
    test = CountTest(tolerance=0.0, alpha=0.005, series=2)
    with pytest.raises(ValueError, match="expected 12"):
        test.update((0.0,) * 6, Increment(1, 1, (0, 0), (0, 0)))
