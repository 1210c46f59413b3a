"""Canary analysis, simulated: false rollbacks and detection times, sequential vs threshold.

Each simulated canary serves a share `weight` of `rate_rps` requests per second next to the
stable track, for `horizon_s`. Every `scrape_s` (one Prometheus scrape) both tracks' counter
increases are drawn: requests (Poisson), 5xx answers (binomial, stable's rate × the canary's
`error_factor`) and request-duration bucket counts (multinomial over the runtime's bucket
bounds; log-normal latencies, the canary's tail above stable's p98 stretched by
`tail_factor`, so its p99 is `tail_factor` × stable's).

- sequential mode: the operator's own tests (`analysis.sequential_tests`) take every
  increment, i.e. they are checked at every scrape; a rejection rolls the canary back.
- threshold mode: every `interval_s` the window's error ratio is held to `max_error_rate`
  and the canary's p99 (Prometheus's `histogram_quantile`, interpolated in the buckets) to
  `max_latency_ratio` × stable's; `failure_threshold` failed analyses in a row roll back,
  fewer than `min_requests` canary requests is inconclusive (as the operator's defaults).

The last three lines are the headline: `false_rollback_rate=` (sequential, A/A, all
weights), `median_detection_s_sequential=` and `median_detection_s_threshold=` (a canary
with twice stable's error rate at 5% weight).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from fleetserve_operator.analysis import ERROR_TEST, LATENCY_TEST, sequential_tests
from fleetserve_operator.analysis.count_tests import CountTest, Increment, exceedances
from fleetserve_operator.contract import LATENCY_BOUNDS_S
from fleetserve_operator.spec import AnalysisSpec

__all__ = ["Canary", "Outcome", "Scenario", "Threshold", "median_detection_s", "simulate"]

SPEC = AnalysisSpec(prometheus_url="http://prometheus:9090")
"""The defaults of `spec.rollout.analysis`: α 0.01, the tolerances."""


@dataclass(frozen=True, slots=True)
class Threshold:
    """Threshold mode's settings (the defaults, with the error bound above stable's 1%)."""

    interval_s: float = 60.0
    max_error_rate: float = 0.02
    max_latency_ratio: float = 1.5
    failure_threshold: int = 2
    min_requests: int = 20


@dataclass(frozen=True, slots=True)
class Scenario:
    """One kind of canary: its traffic, and how it differs from stable."""

    weight: float
    rate_rps: float
    horizon_s: float = 600.0
    scrape_s: float = 15.0
    stable_error_rate: float = 0.01
    error_factor: float = 1.0
    tail_factor: float = 1.0
    median_s: float = 0.05
    sigma: float = 0.5


@dataclass(frozen=True, slots=True)
class Outcome:
    """When each mode rolled the canary back (seconds after the step began), if it did."""

    sequential_s: float | None
    threshold_s: float | None


def _survival(scenario: Scenario, bound: float, *, canary: bool) -> float:
    """P(latency > bound); the canary's latencies above stable's p98 are stretched."""

    def stable(x: float) -> float:
        z = (math.log(x) - math.log(scenario.median_s)) / scenario.sigma
        return 0.5 * math.erfc(z / math.sqrt(2))

    if not canary or scenario.tail_factor == 1.0:
        return stable(bound)
    p98 = scenario.median_s * math.exp(scenario.sigma * 2.0537489)
    return stable(bound) if bound <= p98 else stable(max(p98, bound / scenario.tail_factor))


def _bucket_probabilities(scenario: Scenario, *, canary: bool) -> list[float]:
    """Probability of each bucket (bound 1, 2, ..., then above the last bound)."""
    survival = [1.0, *(_survival(scenario, b, canary=canary) for b in LATENCY_BOUNDS_S), 0.0]
    return [max(0.0, survival[i] - survival[i + 1]) for i in range(len(survival) - 1)]


def _quantile(q: float, cumulative: Sequence[float]) -> float | None:
    """Prometheus's `histogram_quantile` over cumulative bucket counts (`+Inf` last)."""
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(LATENCY_BOUNDS_S, cumulative, strict=False):
        if count >= rank:
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return LATENCY_BOUNDS_S[-1]


class Canary:
    """One canary's draws, scrape by scrape."""

    def __init__(self, scenario: Scenario, rng: np.random.Generator) -> None:
        self.scenario = scenario
        self.rng = rng
        self.p_stable = _bucket_probabilities(scenario, canary=False)
        self.p_canary = _bucket_probabilities(scenario, canary=True)

    def scrape(self, *, canary: bool) -> tuple[int, int, list[int]]:
        """Requests, 5xx answers and cumulative bucket counts of one scrape interval."""
        s = self.scenario
        share = s.weight if canary else 1.0 - s.weight
        requests = int(self.rng.poisson(s.rate_rps * share * s.scrape_s))
        rate = s.stable_error_rate * (s.error_factor if canary else 1.0)
        errors = int(self.rng.binomial(requests, min(rate, 1.0)))
        counts = self.rng.multinomial(requests, self.p_canary if canary else self.p_stable)
        cumulative = [int(c) for c in np.cumsum(counts)]
        return requests, errors, cumulative


def _sequential_step(
    tests: dict[str, CountTest],
    states: dict[str, tuple[float, ...]],
    canary: tuple[int, int, list[int]],
    stable: tuple[int, int, list[int]],
) -> bool:
    """Feed one scrape's increments into the tests; True once one rejects."""
    (n_c, e_c, b_c), (n_s, e_s, b_s) = canary, stable
    errors = Increment(n_c, n_s, (e_c,), (e_s,))
    latency = Increment(n_c, n_s, exceedances(b_c), exceedances(b_s))
    states[ERROR_TEST] = tests[ERROR_TEST].update(states[ERROR_TEST], errors)
    states[LATENCY_TEST] = tests[LATENCY_TEST].update(states[LATENCY_TEST], latency)
    return any(tests[name].rejects(state) for name, state in states.items())


def _threshold_fails(
    threshold: Threshold, canary: list[tuple[int, int, list[int]]], stable: list[list[int]]
) -> bool | None:
    """One threshold analysis of a window: True failed, False passed, None inconclusive."""
    requests = sum(n for n, _, _ in canary)
    if requests < threshold.min_requests:
        return None
    error_ratio = sum(e for _, e, _ in canary) / requests
    canary_cumulative = [sum(column) for column in zip(*(b for _, _, b in canary), strict=True)]
    stable_cumulative = [sum(column) for column in zip(*stable, strict=True)]
    p99 = _quantile(0.99, canary_cumulative)
    stable_p99 = _quantile(0.99, stable_cumulative)
    if p99 is None or stable_p99 is None:
        return None
    return error_ratio > threshold.max_error_rate or p99 > threshold.max_latency_ratio * stable_p99


def simulate(
    scenario: Scenario,
    canaries: int,
    *,
    seed: int,
    spec: AnalysisSpec = SPEC,
    threshold: Threshold | None = Threshold(),
) -> list[Outcome]:
    """Run `canaries` independent canaries of `scenario` through both modes (same draws)."""
    rng = np.random.default_rng(seed)
    tests = sequential_tests(spec)
    scrapes = int(scenario.horizon_s // scenario.scrape_s)
    outcomes = []
    for _ in range(canaries):
        canary = Canary(scenario, rng)
        states = {name: test.start() for name, test in tests.items()}
        sequential_s: float | None = None
        threshold_s: float | None = None
        window: list[tuple[int, int, list[int]]] = []
        stable_window: list[list[int]] = []
        failures = 0
        for i in range(1, scrapes + 1):
            c, s = canary.scrape(canary=True), canary.scrape(canary=False)
            now = i * scenario.scrape_s
            if sequential_s is None and _sequential_step(tests, states, c, s):
                sequential_s = now
            if threshold is None or threshold_s is not None:
                if sequential_s is not None:
                    break
                continue
            window.append(c)
            stable_window.append(s[2])
            if now % threshold.interval_s < scenario.scrape_s / 2:
                verdict = _threshold_fails(threshold, window, stable_window)
                window, stable_window = [], []
                if verdict is not None:
                    failures = failures + 1 if verdict else 0
                if failures >= threshold.failure_threshold:
                    threshold_s = now
        outcomes.append(Outcome(sequential_s, threshold_s))
    return outcomes


def rollback_rate(outcomes: Sequence[Outcome], mode: str) -> float:
    """Share of canaries that mode rolled back within the horizon."""
    times = [getattr(o, f"{mode}_s") for o in outcomes]
    return sum(t is not None for t in times) / len(outcomes)


def median_detection_s(outcomes: Sequence[Outcome], mode: str, horizon_s: float) -> float:
    """Median time to rollback; a canary never rolled back counts as the horizon."""
    times = [getattr(o, f"{mode}_s") for o in outcomes]
    return statistics.median(horizon_s if t is None else t for t in times)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the A/A false-rollback rates and the detection times; headline last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, default=1000, help="A/A canaries per weight")
    parser.add_argument("--regressed", type=int, default=200, help="canaries per regression")
    parser.add_argument("--rate-rps", type=float, default=50.0, help="total requests/s (A/A)")
    parser.add_argument("--detect-rate-rps", type=float, default=500.0, help="requests/s")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    false_rollbacks: list[float] = []
    for weight in (0.01, 0.05, 0.20):
        aa = Scenario(weight=weight, rate_rps=args.rate_rps)
        outcomes = simulate(aa, args.canaries, seed=args.seed)
        rates = {mode: rollback_rate(outcomes, mode) for mode in ("sequential", "threshold")}
        false_rollbacks.append(rates["sequential"])
        print(
            f"aa weight={weight:.0%} rate_rps={args.rate_rps:g} horizon_s={aa.horizon_s:g} "
            f"false_rollback_sequential={rates['sequential']:.4f} "
            f"false_rollback_threshold={rates['threshold']:.4f}"
        )
    base = Scenario(weight=0.05, rate_rps=args.detect_rate_rps, horizon_s=1800.0)
    regressions = {
        "errors_x2": replace(base, error_factor=2.0),
        "p99_plus_50pct": replace(base, tail_factor=1.5),
    }
    medians: dict[str, dict[str, float]] = {}
    for name, scenario in regressions.items():
        outcomes = simulate(scenario, args.regressed, seed=args.seed + 1)
        medians[name] = {
            mode: median_detection_s(outcomes, mode, scenario.horizon_s)
            for mode in ("sequential", "threshold")
        }
        print(
            f"detect {name} weight=5% rate_rps={args.detect_rate_rps:g} "
            f"median_s_sequential={medians[name]['sequential']:g} "
            f"median_s_threshold={medians[name]['threshold']:g} "
            f"detected_sequential={rollback_rate(outcomes, 'sequential'):.2f} "
            f"detected_threshold={rollback_rate(outcomes, 'threshold'):.2f}"
        )
    print(f"false_rollback_rate={max(false_rollbacks):.4f}")
    print(f"median_detection_s_sequential={medians['errors_x2']['sequential']:g}")
    print(f"median_detection_s_threshold={medians['errors_x2']['threshold']:g}")


if __name__ == "__main__":
    main()
