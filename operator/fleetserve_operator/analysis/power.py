"""The power gate: evidence that the canary is *not* `minDetectableRatio` times worse.

The rejection tests (`count_tests`) roll a worse canary back once the evidence is strong
enough; on their own, a step that gathered too little evidence to reject anything would
read as a pass. A gated step (`queries.AnalysisTarget.gated`) therefore advances only once
each test's gate has *cleared*: an anytime-valid test has rejected the hypothesis

    H: the canary's odds of an event are at least R times stable's
       and its rate is at least the rate whose odds are R times those of `FLOOR`

with R = `minDetectableRatio`, at level β = 1 - `power`. A canary that is R times worse
(and fails, or is slow, at least R times `FLOOR` as often) then clears, and is promoted,
with probability at most β, however often it is looked at: a confidence sequence for the
canary's odds ratio whose upper end has fallen below R, in the words of the docs. A
canary like stable clears once it has served enough requests, about as many as a
fixed-size test of power 1 - β would need; `samples_needed` projects that number from
stable's measured rate, for status.

The gate's e-value is the average of two mixtures, each over `ALTERNATIVES` (1/g of the
hypothesis's bound), which is an e-process under H as each is:

- the share of the events (`fnch_log_ratio`): in an increment where both tracks answered,
  the exact conditional law of the canary's `k` of the `x` events (Fisher's noncentral
  hypergeometric) scored at ψ1 = R/g against R. Its likelihood ratio has expectation 1 at
  ψ = R and less above, whatever the rates and the traffic split;
- the canary's own rate (`bernoulli_log_ratio`), at p1 against p0 = `odds_scaled(FLOOR, R)`:
  with stable at no events at all there is no share to learn from, and a regression from
  0 to a rate under `FLOOR` is not one the gate holds a rollout for. `FLOOR` is 1%, the
  tail a p99 leaves.

Without stable traffic (the 100% step, when no earlier step cleared the gate) the share is
replaced by the canary's own rate against R times a lower confidence bound on stable's rate
from its baseline, at level β/10; the gate's threshold is 1/(0.9·β), so the confidence
bound's failure and the test's together stay within β. The state is one log-likelihood
ratio per component: the share's mixture, then the rate's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleetserve_operator.analysis.count_tests import e_value
from fleetserve_operator.analysis.rates import (
    bernoulli_log_ratio,
    fnch_log_ratio,
    lower_bound,
    odds_scaled,
)

__all__ = ["ALTERNATIVES", "BASELINE_SHARE", "FLOOR", "PowerGate", "TrackSample"]

ALTERNATIVES = (1.5, 2.0, 4.0, 16.0)
"""Divisors g of R that the gate bets on: a canary a little better than R times worse, one
like stable (g = R = 2 at the default), and clearly better ones."""

FLOOR = 0.01
"""The rate below which stable's rate counts as this one: a canary is held for evidence
only against a rate of at least R times the odds of 1%."""

BASELINE_SHARE = 0.1
"""The part of β set aside for the baseline's confidence bound at the 100% step."""


@dataclass(frozen=True, slots=True)
class TrackSample:
    """One track's trials and events of the gate's series, in an increment or a baseline.

    The series: errors, or answers slower than the gate's bound.
    """

    trials: float
    events: float

    @property
    def rate(self) -> float | None:
        """Events per trial; None without trials."""
        return self.events / self.trials if self.trials > 0 else None


@dataclass(frozen=True, slots=True)
class PowerGate:
    """One test's gate: clears when "the canary is `ratio` times worse" is rejected at `beta`."""

    ratio: float
    """R, `minDetectableRatio`: how many times stable's odds the gate rules out."""
    beta: float
    """1 - `power`: the most probability that a canary R times worse clears."""

    @property
    def threshold(self) -> float:
        """The e-value that clears: 1/(β minus the baseline's share)."""
        return 1.0 / ((1.0 - BASELINE_SHARE) * self.beta)

    @property
    def floor_rate(self) -> float:
        """The rate the canary's own mixture holds it to: R times the odds of `FLOOR`."""
        return odds_scaled(FLOOR, self.ratio)

    def start(self) -> tuple[float, ...]:
        """Every component at 0 (e-value 1)."""
        return (0.0,) * (2 * len(ALTERNATIVES))

    def update(
        self, state: Sequence[float], canary: TrackSample, stable: TrackSample, weight: float = 1.0
    ) -> tuple[float, ...]:
        """The state after an increment both tracks answered (`weight` scales its scores)."""
        k, m = round(canary.events), round(stable.events)
        n_c, n_s = round(canary.trials), round(stable.trials)
        share = [
            fnch_log_ratio(k, k + m, n_c, n_s, self.ratio / g, self.ratio) for g in ALTERNATIVES
        ]
        return self._added(state, share, canary, weight)

    def update_vs_baseline(
        self,
        state: Sequence[float],
        canary: TrackSample,
        baseline: TrackSample,
        weight: float = 1.0,
    ) -> tuple[float, ...]:
        """The state after an increment of the canary alone, held to stable's baseline."""
        delta = BASELINE_SHARE * self.beta
        p0 = odds_scaled(lower_bound(baseline.events, baseline.trials, delta), self.ratio)
        share = [
            bernoulli_log_ratio(canary.events, canary.trials, odds_scaled(p0, 1.0 / g), p0)
            for g in ALTERNATIVES
        ]
        return self._added(state, share, canary, weight)

    def _added(
        self, state: Sequence[float], share: list[float], canary: TrackSample, weight: float
    ) -> tuple[float, ...]:
        p0 = self.floor_rate
        own = [
            bernoulli_log_ratio(canary.events, canary.trials, odds_scaled(p0, 1.0 / g), p0)
            for g in ALTERNATIVES
        ]
        return tuple(
            value + weight * step for value, step in zip(state, [*share, *own], strict=True)
        )

    def e_value(self, state: Sequence[float]) -> float:
        """The evidence against "the canary is `ratio` times worse"."""
        return e_value(state)

    def samples_needed(
        self,
        state: Sequence[float],
        seen: float,
        rate: float | None,
        split: float | None,
        weight: float = 1.0,
    ) -> float | None:
        """About how many canary trials the gate needs in all to clear, if it is like stable.

        `seen`, plus what the closest component still lacks at its expected gain.

        `rate`: stable's rate of the event; `split`: canary trials per stable trial now (None:
        no stable traffic, the share's mixture then bets against the baseline's rate
        itself). None when no component gains on average (no estimate).
        """
        if rate is None:
            return None
        target = math.log(self.threshold * len(state))
        own = self.floor_rate
        rates = [odds_scaled(own, 1.0 / g) for g in ALTERNATIVES]
        gains = [self._share_gain(rate, split, g) for g in ALTERNATIVES]
        gains += [_bernoulli_gain(rate, p1, own) for p1 in rates]
        remaining = [
            max(0.0, target - value) / (weight * gain)
            for value, gain in zip(state, gains, strict=True)
            if gain > 0
        ]
        return seen + min(remaining) if remaining else None

    def _share_gain(self, rate: float, split: float | None, g: float) -> float:
        """Expected log-likelihood gain per canary trial of the share's component g."""
        if split is None:
            p0 = odds_scaled(rate, self.ratio)
            return _bernoulli_gain(rate, odds_scaled(p0, 1.0 / g), p0)
        if split <= 0:
            return 0.0
        # Rare events: the share's law is close to the binomial with these probabilities.
        theta0 = self.ratio * split / (self.ratio * split + 1.0)
        theta1 = (self.ratio / g) * split / ((self.ratio / g) * split + 1.0)
        up, down = math.log(theta1 / theta0), math.log((1.0 - theta1) / (1.0 - theta0))
        return rate * (up + down / split)


def _bernoulli_gain(rate: float, p1: float, p0: float) -> float:
    """Expected log-likelihood ratio of p1 against p0 per trial at the true `rate`."""
    if p0 <= 0.0 or p0 >= 1.0 or p1 <= 0.0 or p1 >= 1.0:
        return 0.0
    return rate * math.log(p1 / p0) + (1.0 - rate) * math.log((1.0 - p1) / (1.0 - p0))
