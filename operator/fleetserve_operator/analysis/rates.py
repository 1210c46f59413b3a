"""Likelihood ratios and confidence bounds for event rates: the arithmetic under the tests.

Pure functions of the standard library (`math`), like the rest of the analysis arithmetic:

- `bernoulli_log_ratio`: the log-likelihood ratio of `k` events in `n` independent trials
  under rate `p1` against rate `p0`. With p1 > p0 it is increasing in `k`, so for a true
  rate ≤ p0 its exponential has expectation ≤ 1 (a fair bet against "rate ≤ p0"); with
  p1 < p0 the same holds for a true rate ≥ p0.
- `fnch_log_ratio`: the log-likelihood ratio, under Fisher's noncentral hypergeometric law,
  of the canary's `k` of `x` events between `n_c` canary and `n_s` stable trials, at odds
  ratio ψ1 against ψ0. That law is the exact law of `k` given `x` when each trial of a
  track is an event independently (the canary's odds being ψ times stable's), so the
  ratio's exponential has expectation exactly 1 at ψ0, and, the law having a monotone
  likelihood ratio in ψ, at most 1 for every ψ ≥ ψ0 when ψ1 < ψ0.
- `upper_bound`, `lower_bound`: Chernoff (Kullback-Leibler) confidence bounds on a rate
  from `k` events in `n` trials: P(true rate above `upper_bound(k, n, δ)`) ≤ δ.
- `odds_scaled`: the rate whose odds are a factor times another rate's.
"""

from __future__ import annotations

import math

__all__ = [
    "LOG_CAP",
    "bernoulli_log_ratio",
    "fnch_log_ratio",
    "lower_bound",
    "odds_scaled",
    "upper_bound",
]

LOG_CAP = 700.0
"""A log-likelihood ratio is kept within ±`LOG_CAP` (exp(700) is near the largest float): an
e-value that large has decided long ago."""


def odds_scaled(rate: float, factor: float) -> float:
    """The rate whose odds are `factor` times those of `rate` (0 and 1 stay where they are)."""
    if rate <= 0.0 or rate >= 1.0:
        return min(max(rate, 0.0), 1.0)
    odds = factor * rate / (1.0 - rate)
    return odds / (1.0 + odds)


def _capped(value: float) -> float:
    return min(max(value, -LOG_CAP), LOG_CAP)


def bernoulli_log_ratio(k: float, n: float, p1: float, p0: float) -> float:
    """log[p1^k (1 - p1)^(n - k) / (p0^k (1 - p0)^(n - k))], within ±`LOG_CAP`.

    An event where p0 is 0 (or a non-event where p0 is 1) is impossible under p0: the ratio
    is the cap. A factor both rates give the same probability contributes nothing.
    """
    misses = max(n - k, 0.0)
    total = 0.0
    for count, a, b in ((k, p1, p0), (misses, 1.0 - p1, 1.0 - p0)):
        if count <= 0 or a == b:
            continue
        if b <= 0.0:
            return LOG_CAP
        if a <= 0.0:
            return -LOG_CAP
        total += count * math.log(a / b)
    return _capped(total)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _log_normaliser(x: int, n_c: int, n_s: int, log_psi: float) -> float:
    """The logarithm of Σ_u C(n_c, u) C(n_s, x - u) ψ^u over the canary's possible u."""
    terms = [
        _log_comb(n_c, u) + _log_comb(n_s, x - u) + u * log_psi
        for u in range(max(0, x - n_s), min(x, n_c) + 1)
    ]
    top = max(terms)
    return top + math.log(sum(math.exp(term - top) for term in terms))


def fnch_log_ratio(k: int, x: int, n_c: int, n_s: int, psi1: float, psi0: float) -> float:
    """The log-likelihood ratio f(k; ψ1) / f(k; ψ0) of Fisher's noncentral hypergeometric law.

    The canary's `k` of `x` events among `n_c` canary and `n_s` stable trials; 0 when the
    split is forced (no event, or every trial an event) and `k` says nothing about ψ.
    """
    if x <= 0 or x >= n_c + n_s or n_c <= 0 or n_s <= 0:
        return 0.0
    log1, log0 = math.log(psi1), math.log(psi0)
    value = k * (log1 - log0) + _log_normaliser(x, n_c, n_s, log0)
    return _capped(value - _log_normaliser(x, n_c, n_s, log1))


def _kl(p: float, q: float) -> float:
    """Kullback-Leibler divergence of Bernoulli(q) from Bernoulli(p)."""
    total = 0.0
    if p > 0.0:
        total += p * math.log(p / q)
    if p < 1.0:
        total += (1.0 - p) * math.log((1.0 - p) / (1.0 - q))
    return total


def _bound(k: float, n: float, delta: float, *, upper: bool) -> float:
    """The farthest rate q on one side of k/n with n·KL(k/n, q) ≤ log(1/δ) (bisection)."""
    if n <= 0:
        return 1.0 if upper else 0.0
    observed = min(max(k / n, 0.0), 1.0)
    budget = math.log(1.0 / delta) / n
    inside, outside = observed, 1.0 if upper else 0.0
    if _kl_or_inf(observed, outside) <= budget:
        return outside
    for _ in range(60):
        middle = (inside + outside) / 2.0
        if _kl_or_inf(observed, middle) <= budget:
            inside = middle
        else:
            outside = middle
    return inside


def _kl_or_inf(p: float, q: float) -> float:
    if q <= 0.0 or q >= 1.0:
        return 0.0 if p == q else math.inf
    return _kl(p, q)


def upper_bound(k: float, n: float, delta: float) -> float:
    """A rate the true one exceeds with probability at most δ, from `k` events in `n` trials.

    Chernoff: P(k/n ≤ a) ≤ exp(-n·KL(a, q)) for a < q, so the largest q with
    n·KL(k/n, q) ≤ log(1/δ) is exceeded by the true rate with probability ≤ δ.
    """
    return _bound(k, n, delta, upper=True)


def lower_bound(k: float, n: float, delta: float) -> float:
    """A rate the true one falls below with probability at most δ (see `upper_bound`)."""
    return _bound(k, n, delta, upper=False)
