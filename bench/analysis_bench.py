"""Canary analysis, simulated: false rollbacks, detection times and power, sequential mode.

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

The power table rolls canaries out whole, through the operator's own sequential path
(`analysis.accumulate` at every scrape, `judged_at_interval_end` at each interval's end, and
the rollout's rules: a rejection rolls back at once, a pass advances, too little evidence at
a gated step holds until `progressDeadline` after the interval, then rolls back): steps
5/20/50/100, the analysis's defaults but `maxErrorRate: 0.02` (above stable's 1%), stable's
10 minutes before the rollout as part of its baseline. For each regression (errors or p99
1.5x, 2x, 3x, 5x, and none: A/A) at 50 and 500 requests/s and 4/15/60 s steps, it prints
the fraction promoted, rolled back, and rolled back at the deadline, and the median time
to that decision.

The last lines are the headline: `median_detection_s_sequential=`,
`median_detection_s_threshold=` (a canary with twice stable's error rate at 5% weight),
`promoted_at_3x_errors=` (the power table's 3x error canaries, all rates and steps) and
`false_rollback_rate=` (the largest share of A/A canaries rolled back: at the fixed weights,
and in the power table's whole rollouts).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from fleetserve_operator.analysis import (
    ERROR_TEST,
    LATENCY_TEST,
    AnalysisTarget,
    TrackScope,
    accumulate,
    sequential_plan,
)
from fleetserve_operator.analysis.count_tests import CountTest, Increment, exceedances
from fleetserve_operator.analysis.sequential import judged_at_interval_end
from fleetserve_operator.contract import LATENCY_BOUNDS_S
from fleetserve_operator.naming import Track
from fleetserve_operator.spec import (
    AnalysisSpec,
    Evidence,
    InconclusiveReason,
    TrackCounts,
    Verdict,
)
from fleetserve_operator.testing import ScriptedMetricSource

__all__ = [
    "Canary",
    "Decision",
    "RollbackTimes",
    "Rollout",
    "Scenario",
    "Threshold",
    "median_detection_s",
    "roll_out",
    "simulate",
]

SPEC = AnalysisSpec(prometheus_url="http://prometheus:9090")
"""The defaults of `spec.rollout.analysis`: α 0.01, the tolerances."""
POWER_SPEC = SPEC.model_copy(update={"max_error_rate": 0.02})
"""The power table's: the defaults (`minDetectableRatio` 2, `power` 0.9), the error bound
above stable's 1%, so the 1.5x and 2x error canaries are judged against stable, not by it."""


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
class RollbackTimes:
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
        return self.draw(share, s.scrape_s, canary=canary)

    def draw(self, share: float, seconds: float, *, canary: bool) -> tuple[int, int, list[int]]:
        """What a track with `share` of the traffic answers in `seconds`."""
        s = self.scenario
        requests = int(self.rng.poisson(s.rate_rps * share * seconds))
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
) -> list[RollbackTimes]:
    """Run `canaries` independent canaries of `scenario` through both modes (same draws)."""
    rng = np.random.default_rng(seed)
    tests = sequential_plan(spec).tests
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
        outcomes.append(RollbackTimes(sequential_s, threshold_s))
    return outcomes


def rollback_rate(outcomes: Sequence[RollbackTimes], mode: str) -> float:
    """Share of canaries that mode rolled back within the horizon."""
    times = [getattr(o, f"{mode}_s") for o in outcomes]
    return sum(t is not None for t in times) / len(outcomes)


def median_detection_s(outcomes: Sequence[RollbackTimes], mode: str, horizon_s: float) -> float:
    """Median time to rollback; a canary never rolled back counts as the horizon."""
    times = [getattr(o, f"{mode}_s") for o in outcomes]
    return statistics.median(horizon_s if t is None else t for t in times)


@dataclass(frozen=True, slots=True)
class Rollout:
    """A whole rollout: its traffic and steps, and how the canary differs from stable."""

    rate_rps: float
    """Both tracks' requests per second."""
    interval_s: float
    """Each step's interval (`rollout.interval`)."""
    error_factor: float = 1.0
    """The canary's error rate over stable's (1%)."""
    tail_factor: float = 1.0
    """The canary's p99 over stable's (its answers above stable's p98 stretched)."""
    steps: tuple[int, ...] = (5, 20, 50, 100)
    scrape_s: float = 5.0
    """Prometheus's scrape interval; the operator looks at every scrape."""
    deadline_s: float = 600.0
    """`progressDeadline`: the longest hold for evidence after a step's interval."""
    history_s: float = 600.0
    """Stable's traffic before the rollout (part of the 100% step's baseline)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """How a rollout ended (`promoted`, `rolled_back`, `deadline`) and when (s from its start)."""

    outcome: str
    at_s: float


class _Totals:
    """One track's cumulative counters, as Prometheus sums them."""

    def __init__(self) -> None:
        self.requests, self.errors = 0, 0
        self.buckets = [0] * (len(LATENCY_BOUNDS_S) + 1)

    def add(self, drawn: tuple[int, int, list[int]]) -> TrackCounts:
        requests, errors, buckets = drawn
        self.requests += requests
        self.errors += errors
        self.buckets = [a + b for a, b in zip(self.buckets, buckets, strict=True)]
        return TrackCounts(
            requests=self.requests,
            errors=self.errors,
            latency_buckets=[float(b) for b in self.buckets],
        )


_CANARY = TrackScope("bench", "model", "2", Track.CANARY)
_STABLE = TrackScope("bench", "model", "1", Track.STABLE)
_NO_QUERIES = ScriptedMetricSource()
"""No PromQL check is configured: a step's verdict rests on the tests alone."""


def _next_step(evidence: Evidence) -> Evidence:
    return evidence.model_copy(update={"step_samples": 0.0, "step_tokens": 0.0})


def roll_out(
    rollout: Rollout, rng: np.random.Generator, spec: AnalysisSpec = POWER_SPEC
) -> Decision:
    """One canary rolled out through every step as the operator would, scrape by scrape."""
    draws = Canary(
        Scenario(
            weight=0.0,
            rate_rps=rollout.rate_rps,
            error_factor=rollout.error_factor,
            tail_factor=rollout.tail_factor,
        ),
        rng,
    )
    canary, stable = _Totals(), _Totals()
    evidence = accumulate(
        spec, None, canary.add((0, 0, [0] * len(canary.buckets))),
        stable.add(draws.draw(1.0, rollout.history_s, canary=False)),
    )  # fmt: skip
    now = 0.0
    steps = rollout.steps
    for index, weight in enumerate(steps):
        following = steps[index + 1] if index + 1 < len(steps) else 100
        target = AnalysisTarget(
            _CANARY, _STABLE, "1m", gated=following > 50, canary_alone=weight == 100
        )
        interval_start = now
        evidence = _next_step(evidence)
        while True:
            now += rollout.scrape_s
            share = weight / 100
            canary_counts = canary.add(draws.draw(share, rollout.scrape_s, canary=True))
            stable_counts = stable.add(draws.draw(1 - share, rollout.scrape_s, canary=False))
            evidence = accumulate(
                spec, evidence, canary_counts, stable_counts, canary_alone=weight == 100
            )
            if evidence.rejected:
                return Decision("rolled_back", now)
            waited = now - interval_start - rollout.interval_s
            if waited < 0:
                continue
            result = judged_at_interval_end(_NO_QUERIES, spec, target, evidence)
            if result.verdict is Verdict.PASSED:
                break
            if result.reason is InconclusiveReason.INSUFFICIENT_EVIDENCE:
                if waited >= rollout.deadline_s:
                    return Decision("deadline", now)
                continue
            interval_start = now  # too few requests: judged again after a fresh interval
    return Decision("promoted", now)


POWER_REGRESSIONS: dict[str, tuple[float, float]] = {
    "none": (1.0, 1.0),
    **{f"errors_x{f:g}": (f, 1.0) for f in (1.5, 2.0, 3.0, 5.0)},
    **{f"p99_x{f:g}": (1.0, f) for f in (1.5, 2.0, 3.0, 5.0)},
}
"""The power table's canaries, as (error factor, p99 factor): A/A, then error rates and p99s
1.5, 2, 3 and 5 times stable's."""


def power_table(canaries: int, seed: int) -> dict[tuple[str, float, float], list[Decision]]:
    """Every regression at 50 and 500 requests/s with 4, 15 and 60 s steps, printed by line."""
    table: dict[tuple[str, float, float], list[Decision]] = {}
    for name, (errors, tail) in POWER_REGRESSIONS.items():
        for rate in (50.0, 500.0):
            for interval in (4.0, 15.0, 60.0):
                rng = np.random.default_rng([seed, int(rate), int(interval), len(table)])
                rollout = Rollout(rate, interval, error_factor=errors, tail_factor=tail)
                decisions = [roll_out(rollout, rng) for _ in range(canaries)]
                table[name, rate, interval] = decisions
                shares = {
                    outcome: sum(d.outcome == outcome for d in decisions) / len(decisions)
                    for outcome in ("promoted", "rolled_back", "deadline")
                }
                median = statistics.median(d.at_s for d in decisions)
                print(
                    f"power regression={name} rate_rps={rate:g} interval_s={interval:g} "
                    f"canaries={canaries} promoted={shares['promoted']:.3f} "
                    f"rolled_back={shares['rolled_back']:.3f} "
                    f"deadline={shares['deadline']:.3f} median_decision_s={median:g}"
                )
    return table


def _share(decisions: Sequence[Decision], *outcomes: str) -> float:
    return sum(d.outcome in outcomes for d in decisions) / len(decisions)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the A/A false-rollback rates, detection times and the power table; headline last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, default=1000, help="A/A canaries per weight")
    parser.add_argument("--regressed", type=int, default=200, help="canaries per regression")
    parser.add_argument("--rate-rps", type=float, default=50.0, help="total requests/s (A/A)")
    parser.add_argument("--detect-rate-rps", type=float, default=500.0, help="requests/s")
    parser.add_argument("--rollouts", type=int, default=200, help="canaries per power-table cell")
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
    table = power_table(args.rollouts, args.seed + 2)
    same = [d for (name, _, _), ds in table.items() if name == "none" for d in ds]
    tripled = [d for (name, _, _), ds in table.items() if name == "errors_x3" for d in ds]
    false_rollbacks.append(_share(same, "rolled_back", "deadline"))
    print(f"median_detection_s_sequential={medians['errors_x2']['sequential']:g}")
    print(f"median_detection_s_threshold={medians['errors_x2']['threshold']:g}")
    print(f"promoted_at_3x_errors={_share(tripled, 'promoted'):.4f}")
    print(f"false_rollback_rate={max(false_rollbacks):.4f}")


if __name__ == "__main__":
    main()
