"""Guardrails: anytime-valid tests that the canary's own rate of an event exceeds a bound.

The user's absolute bounds apply in sequential mode as in threshold mode, judged on the
canary's own counts at every look rather than on a window:

- `maxErrorRate`: a 5xx answer, at most that rate;
- `maxP99LatencyMs` (encoders), `maxTtftP99Ms` and `maxItlP99Ms` (generative models): an
  answer (first token, gap between tokens) slower than the bound, at most 1% of them, which
  is "p99 ≤ bound". A histogram counts answers slower than its bucket bounds only, so the
  bound is judged at the first bucket bound at or above it (`bound_index`): fewer answers
  are slower than that, so a rejection there still means p99 > bound.

Each is a one-sided test of "rate ≤ p0" (`bernoulli_log_ratio`), a mixture over the rates
whose odds are g times p0's (the `count_tests.ALTERNATIVES`), rejecting at 1/α of the test.
A bound of 0 rejects at the first event (none can happen under it); a bound of 1 never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetserve_operator.analysis.count_tests import ALTERNATIVES, e_value
from fleetserve_operator.analysis.rates import LOG_CAP, bernoulli_log_ratio, odds_scaled

__all__ = ["QUANTILE_TAIL", "BoundTest", "bound_index"]

QUANTILE_TAIL = 0.01
"""The share of answers a p99 leaves above it."""


def bound_index(bounds: Sequence[float], limit_s: float) -> int:
    """The index of the first bucket bound at or above `limit_s`.

    Raises:
        ValueError: `limit_s` is above the last bound (which the spec refuses: no p99 there
            can be measured).
    """
    index = next((i for i, bound in enumerate(bounds) if bound >= limit_s), None)
    if index is None:
        msg = f"a p99 bound of {limit_s}s is above the histogram's last bound {bounds[-1]}s"
        raise ValueError(msg)
    return index


@dataclass(frozen=True, slots=True)
class BoundTest:
    """The test of "the canary's rate of an event is at most `rate`", at level `alpha`."""

    rate: float
    """The bound: `maxErrorRate`, or the 1% of answers a p99 leaves above it."""
    alpha: float
    """The test's share of the analysis's α."""

    @property
    def threshold(self) -> float:
        """The e-value at which the test rejects: 1/α."""
        return 1.0 / self.alpha

    def start(self) -> tuple[float, ...]:
        """Every component at 0 (e-value 1)."""
        return (0.0,) * len(ALTERNATIVES)

    def update(
        self, state: Sequence[float], events: float, trials: float, weight: float = 1.0
    ) -> tuple[float, ...]:
        """The state after the canary's `events` in `trials` (`weight` scales the scores)."""
        if trials <= 0:
            return tuple(state)
        if self.rate <= 0:
            # No event can happen under the bound: the first one decides.
            steps = [LOG_CAP if events > 0 else 0.0] * len(ALTERNATIVES)
        else:
            steps = [
                bernoulli_log_ratio(events, trials, odds_scaled(self.rate, g), self.rate)
                for g in ALTERNATIVES
            ]
        return tuple(value + weight * step for value, step in zip(state, steps, strict=True))

    def e_value(self, state: Sequence[float]) -> float:
        """The evidence that the canary's rate is above the bound."""
        return e_value(state)
