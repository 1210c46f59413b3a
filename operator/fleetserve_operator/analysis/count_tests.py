"""Anytime-valid sequential tests of a canary against the stable track, on count data.

A canary is watched continuously: each time the operator looks (every few seconds, at
least once per Prometheus scrape) it feeds the counter increases since its last look into
these tests, and rolls the canary back as soon as one rejects. However often it looks, the
probability that a canary which is *not* worse than stable is ever rolled back stays below
α: the tests are e-processes (Ramdas et al., "Game-theoretic statistics and safe
anytime-valid inference", 2023) built by the method of mixtures, as in Lindon, Sanden and
Shirikian, "Rapid Regression Detection in Software Deployments through Sequential Testing"
(KDD 2022, arXiv 2205.14762), whose count-data tests condition on the total count of
events and compare the canary's share of them with its share of the traffic.

The model. One increment is what both tracks answered between two looks: `n_c` canary and
`n_s` stable requests, of which `k` and `m` were events (a 5xx answer; an answer slower
than a latency bound). Each request of track t is an event with probability p_t,
independently. Given the total `x = k + m`, the canary's count `k` follows Fisher's
noncentral hypergeometric law, which depends only on the odds ratio
ψ = [p_c / (1 - p_c)] / [p_s / (1 - p_s)]. The null hypothesis of a check is ψ ≤ ψ0 =
1 + tolerance ("the canary's odds of an event are at most (1 + tolerance) times stable's";
for rare events such as errors, the same as their rates); the alternative is ψ > ψ0.

The test statistic. As Lindon et al. do for Poisson counts, each increment is scored with
the binomial likelihood of `k` given `x`, where a ratio ψ makes an event the canary's with
probability θ(ψ) = ψ·e / (ψ·e + 1), e = n_c / n_s (the traffic share enters through e, so
a weight change mid-rollout, or an uneven replica split, is accounted for exactly):

    ℓ_t(ψ1) = k·log(θ(ψ1) / θ(ψ0)) + m·log((1 - θ(ψ1)) / (1 - θ(ψ0)))

For a true ratio ψ ≤ ψ0 the expectation of exp(ℓ_t(ψ1)), ψ1 > ψ0, is at most 1: the
hypergeometric law is less dispersed than that binomial (for ψ0 = 1 this is Hoeffding's
comparison of sampling without and with replacement; for ψ0 > 1
`tests/operator/analysis/test_count_tests.py` checks the inequality exactly over a grid of
counts, shares and ratios), and the score increases in `k`, so a smaller ψ only lowers it.
Hence L_T(ψ1) = Σ_{t ≤ T} ℓ_t(ψ1) makes exp(L_T(ψ1)) a test supermartingale under the
null, and so does any mixture with weights fixed in advance. The e-value of a check is
the average of exp(L_T) over a grid of alternatives ψ1 = ψ0·g (`ALTERNATIVES`) and over
the check's event series (one for errors; one per latency bucket bound for latency, so a
regression in the tail or in the median is caught by the bounds where it shows, without
estimating a quantile). By Ville's inequality, P(sup_T E_T ≥ 1/α) ≤ α under the null:
the check rejects the first time its e-value reaches 1/α, and that is valid whenever,
and however often, it is looked at.

Without stable traffic (the 100% step) there is no share to compare: each increment of
the canary is then held to stable's baseline instead (`update_vs_baseline`): its counts
before stable's traffic ran out, in the previous steps and before the rollout. The
canary's own events are scored with the Bernoulli likelihood ratio (`rates`) against the
rate p0 whose odds are ψ0 times those of an upper confidence bound of stable's rate from
that baseline, at level δ per series. On the event that every series' bound holds
(probability ≥ 1 - δ·series, fixed before those increments), each factor is again a fair
bet or better under the null, so the running product stays a supermartingale there, and
the check rejects falsely with probability at most α + δ·series: the caller sets δ aside
from α (`sequential.sequential_plan`).

Only increments and the running sums L are needed: the state of a check is its list of
log-likelihood ratios (one per series and alternative), so a restarted operator resumes
from `status` with the same evidence. Pure functions of the standard library (`math`):
the operator image carries no numerical stack.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleetserve_operator.analysis.rates import bernoulli_log_ratio, odds_scaled, upper_bound

__all__ = [
    "ALTERNATIVES",
    "CountTest",
    "Increment",
    "e_value",
    "exceedances",
]

ALTERNATIVES = (1.5, 2.0, 3.0, 5.0, 10.0, 100.0)
"""Multiples g of the null ratio ψ0 that the mixture bets on, with equal weights: from a
regression half again worse than tolerated to one that fails nearly everything, where a
few events are enough."""


@dataclass(frozen=True, slots=True)
class Increment:
    """What both tracks answered between two looks: requests, and events per series.

    `weight` (at most 1, fixed before the events are seen) scales every score of the
    increment: a stream's token gaps weigh as one answer (`queries.HistogramTest`).
    """

    canary_requests: float
    stable_requests: float
    canary_events: Sequence[float]
    stable_events: Sequence[float]
    weight: float = 1.0

    @property
    def informative(self) -> bool:
        """Whether both tracks answered requests: a share needs both sides."""
        return self.canary_requests > 0 and self.stable_requests > 0


def exceedances(buckets: Sequence[float]) -> tuple[float, ...]:
    """Requests slower than each bound, from a histogram's cumulative bucket counts.

    `buckets` are the counts of `le` bound 1, 2, ... and last `+Inf` (all requests).
    """
    total = buckets[-1]
    return tuple(max(0.0, total - below) for below in buckets[:-1])


def e_value(log_ratios: Sequence[float]) -> float:
    """The mixture's e-value: the average of exp(L) over its components (1 with none)."""
    if not log_ratios:
        return 1.0
    top = max(log_ratios)
    mean = sum(math.exp(value - top) for value in log_ratios) / len(log_ratios)
    # A bound, not an overflow: an e-value this large has rejected long ago.
    return math.exp(min(top + math.log(mean), 700.0))


@dataclass(frozen=True, slots=True)
class CountTest:
    """One check: "canary's odds of an event ≤ (1 + tolerance) × stable's", at level `alpha`.

    `series` event series share the requests as exposure (1 for errors, one per bucket
    bound for latency); the state is one log-likelihood ratio per series and alternative.
    """

    tolerance: float
    alpha: float
    series: int = 1

    @property
    def threshold(self) -> float:
        """The e-value at which the check rejects: 1/α."""
        return 1.0 / self.alpha

    def start(self) -> tuple[float, ...]:
        """The state before any data: every log-likelihood ratio 0 (e-value 1)."""
        return (0.0,) * (self.series * len(ALTERNATIVES))

    def update(self, state: Sequence[float], increment: Increment) -> tuple[float, ...]:
        """The state after one increment; an uninformative one changes nothing."""
        if len(state) != self.series * len(ALTERNATIVES):
            msg = f"state has {len(state)} entries, expected {self.series * len(ALTERNATIVES)}"
            raise ValueError(msg)
        if not increment.informative:
            return tuple(state)
        share = increment.canary_requests / increment.stable_requests
        null = 1.0 + self.tolerance
        theta0 = null * share / (null * share + 1.0)
        steps: list[tuple[float, float]] = []
        for g in ALTERNATIVES:
            theta1 = g * null * share / (g * null * share + 1.0)
            steps.append((math.log(theta1 / theta0), math.log((1.0 - theta1) / (1.0 - theta0))))
        updated = list(state)
        for s, (k, m) in enumerate(
            zip(increment.canary_events, increment.stable_events, strict=True)
        ):
            if k <= 0 and m <= 0:
                continue
            base = s * len(ALTERNATIVES)
            for j, (up, down) in enumerate(steps):
                updated[base + j] += increment.weight * (max(k, 0.0) * up + max(m, 0.0) * down)
        return tuple(updated)

    def update_vs_baseline(
        self,
        state: Sequence[float],
        increment: Increment,
        baseline: tuple[float, Sequence[float]],
        delta: float,
    ) -> tuple[float, ...]:
        """The state after an increment of the canary alone, held to stable's baseline.

        `baseline`: stable's trials and events per series before its traffic ran out;
        `delta`: the level of each series' upper confidence bound on stable's rate.
        """
        trials, events = baseline
        updated = list(state)
        null = 1.0 + self.tolerance
        n = increment.canary_requests
        for s, k in enumerate(increment.canary_events):
            p0 = odds_scaled(upper_bound(events[s], trials, delta), null)
            base = s * len(ALTERNATIVES)
            for j, g in enumerate(ALTERNATIVES):
                ratio = bernoulli_log_ratio(k, n, odds_scaled(p0, g), p0)
                updated[base + j] += increment.weight * ratio
        return tuple(updated)

    def e_value(self, state: Sequence[float]) -> float:
        """The check's e-value: the evidence against its null so far."""
        return e_value(state)

    def rejects(self, state: Sequence[float]) -> bool:
        """True once the e-value has reached 1/α."""
        return self.e_value(state) >= self.threshold
