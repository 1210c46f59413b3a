"""What the analyses' verdicts do: failures roll back, no data holds, streaks, bounded history."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from fleetserve_operator import rollout
from fleetserve_operator.naming import Track
from fleetserve_operator.records import EventNote, rfc3339
from fleetserve_operator.rollout import Facts, IncrementCounter, OperatorCounter
from fleetserve_operator.spec import AnalysisResult, InconclusiveReason, Verdict
from fleetserve_operator.testing.rollout import (
    ANALYSIS,
    HEALTHY,
    World,
    canary_world,
    event_reasons,
    events,
    make_rollout_spec,
    weights,
)


@pytest.mark.parametrize(
    ("bad", "failing_check"),
    [
        pytest.param({"errors": 0.2}, "error-rate", id="error-spike"),
        pytest.param({"p99": 150}, "p99-latency-vs-stable", id="latency-only"),
    ],
)
def test_regression_at_20_percent_rolls_back(bad: dict[str, float], failing_check: str) -> None:
    """Two failed analyses at 20% (failureThreshold 2): weight 0 at once, canary removed."""
    world = canary_world()
    world.tick(60)
    world.tick(60)
    assert world.status.canary_weight == 20
    world.metrics |= bad
    world.tick(60)
    assert (world.status.phase, world.status.rollout.failed_analyses) == ("Progressing", 1)
    world.tick(60)
    assert world.status.phase == "RolledBack"
    assert weights(world)[-1] == 0
    assert world.canary is None
    assert world.of(IncrementCounter) == [
        IncrementCounter(OperatorCounter.ROLLBACKS, "AnalysisFailed")
    ]
    message = world.status.rollout.message
    assert failing_check in message
    assert "at 20%" in message
    assert world.spec.model.version == "2"  # the spec is never rewritten
    assert world.status.stable_version == "1"
    world.tick(600)
    assert world.status.phase == "RolledBack"  # not retried by itself


@pytest.mark.parametrize(
    "outage",
    [
        pytest.param({"requests": 3}, id="too-little-traffic"),
        pytest.param({"prometheus_online": False}, id="prometheus-down"),
    ],
)
def test_no_data_holds_and_never_promotes(outage: dict[str, Any]) -> None:
    """Inconclusive analyses never pass; after 3 the rollout holds at its weight, then resumes."""
    world = canary_world()
    if "requests" in outage:
        world.metrics |= outage
    else:
        world.prometheus_online = False
    for _ in range(10):
        world.tick(60)
    assert (world.status.phase, world.status.canary_weight) == ("Holding", 1)
    assert "never promoting without data" in world.status.rollout.message
    assert {a.verdict for a in world.status.rollout.analyses} == {"Inconclusive"}
    assert world.rolled(Track.STABLE) == []
    world.metrics = dict(HEALTHY)
    world.prometheus_online = True
    world.tick(60)
    assert (world.status.phase, world.status.canary_weight) == ("Progressing", 5)


def test_holding_starts_at_the_inconclusive_threshold_and_a_failure_resets_it() -> None:
    """Exactly `inconclusiveThreshold` (3) inconclusive analyses in a row hold the rollout.

    Each one is a Warning; a failed analysis then counts as a failure and restarts the
    inconclusive count.
    """
    world = canary_world()
    world.metrics["requests"] = 3
    world.tick(60)
    world.tick(60)
    assert (world.status.phase, world.status.rollout.inconclusive_analyses) == ("Progressing", 2)
    world.tick(60)
    assert (world.status.phase, world.status.rollout.inconclusive_analyses) == ("Holding", 3)
    assert [(kind, reason) for kind, reason, _ in events(world)[-3:]] == [
        ("Warning", "AnalysisInconclusive")
    ] * 3
    world.metrics = dict(HEALTHY, errors=0.5)
    world.tick(60)
    rollout_state = world.status.rollout
    assert (rollout_state.failed_analyses, rollout_state.inconclusive_analyses) == (1, 0)
    kind, reason, detail = events(world)[-1]
    assert (kind, reason) == ("Warning", "AnalysisFailed")
    assert detail == rollout_state.message
    assert "error-rate" in detail


def test_without_analysis_each_interval_passes_on_readiness_and_time() -> None:
    """No analysis configured: every interval is a recorded pass with the weight it held."""
    world = World(make_rollout_spec("1", analysis=None))
    world.tick()
    world.tick()
    world.spec = make_rollout_spec("2", analysis=None)
    world.tick()
    world.tick()
    world.tick(60)
    world.tick(60)
    assert world.status.canary_weight == 20
    first, second = world.status.rollout.analyses
    message = "no analysis configured: judged on readiness and time alone"
    assert (first.verdict, first.message, first.weight) == ("Passed", message, 1)
    assert (second.verdict, second.weight) == ("Passed", 5)
    assert second.time == rfc3339(world.clock.now)


def test_a_due_analysis_without_a_result_is_inconclusive() -> None:
    """With analysis configured, a tick that brings no result never counts as a pass."""
    world = canary_world()
    world.clock.advance(60)
    facts = Facts(stable=world.stable, canary=world.canary)
    step = rollout.next_step(world.spec, world.status, facts, world.clock.now)
    (result,) = step.status.rollout.analyses
    assert (result.verdict, result.reason) == ("Inconclusive", "NotRun")
    assert result.message == "the analysis was due but no result was supplied"
    detail = "NotRun: the analysis was due but no result was supplied (1/3 inconclusive analyses)"
    assert step.status.rollout.message == detail
    assert EventNote("Warning", "AnalysisInconclusive", detail) in step.actions


def test_a_failed_analysis_below_the_threshold_starts_a_fresh_interval() -> None:
    """After one failure (of 2) the canary gets a whole new interval before the next verdict."""
    world = canary_world()
    world.metrics["errors"] = 0.5
    world.tick(60)
    assert (world.status.phase, world.status.rollout.failed_analyses) == ("Progressing", 1)
    world.tick(30)
    assert (world.status.phase, world.status.rollout.failed_analyses) == ("Progressing", 1)
    world.tick(30)
    assert world.status.phase == "RolledBack"


@pytest.mark.parametrize(
    ("bad", "counter"),
    [
        pytest.param({"errors": 0.5}, "failed_analyses", id="failures"),
        pytest.param({"requests": 3}, "inconclusive_analyses", id="inconclusive"),
    ],
)
def test_a_passed_step_breaks_the_streak(bad: dict[str, float], counter: str) -> None:
    """Thresholds count analyses in a row: a pass in between starts the count again."""
    world = canary_world()
    world.metrics |= bad
    world.tick(60)
    assert getattr(world.status.rollout, counter) == 1
    world.metrics = dict(HEALTHY)
    world.tick(60)
    assert (world.status.canary_weight, getattr(world.status.rollout, counter)) == (5, 0)


@pytest.mark.parametrize(
    ("knobs", "kept"),
    [
        pytest.param({"analysis": ANALYSIS | {"historyLimit": 3}}, 3, id="history-limit"),
        pytest.param({"analysis": None}, 10, id="ten-without-analysis"),
    ],
)
def test_the_analysis_history_is_bounded(knobs: dict[str, Any], kept: int) -> None:
    """Only the newest `historyLimit` analyses stay in status (10 without analysis config)."""
    steps = {"steps": [*range(1, 12), 100]}
    world = World(make_rollout_spec("1", **steps, **knobs))
    world.tick()
    world.tick()
    world.spec = make_rollout_spec("2", **steps, **knobs)
    world.tick()
    world.tick()
    for _ in range(11):
        world.tick(60)
    analyses = world.status.rollout.analyses
    assert len(analyses) == kept
    assert analyses[-1].weight == 11


HELD = AnalysisResult(
    verdict=Verdict.INCONCLUSIVE,
    reason=InconclusiveReason.INSUFFICIENT_EVIDENCE,
    message="error-rate-vs-stable has 40 of about 1500 canary requests to rule out 2x",
)


def test_too_little_evidence_holds_at_once_uncounted_until_the_deadline() -> None:
    """The step holds at its first InsufficientEvidence: no count, no history, one Event.

    `progressDeadline` (5m here) after the interval, still short: rolled back.
    """
    world = canary_world()
    world.clear()

    def look(seconds: float) -> None:
        world.clock.advance(seconds)
        facts = replace(world.facts(), analysis=HELD)
        transition = rollout.next_step(world.spec, world.status, facts, world.clock.now)
        world.status = transition.status
        world.actions.extend(transition.actions)

    look(60)
    state = world.status.rollout
    assert (world.status.phase, world.status.canary_weight) == ("Holding", 1)
    assert state.message.startswith("holding for evidence at 1% (at most progressDeadline 5m")
    assert HELD.message in state.message
    assert (state.analyses, state.inconclusive_analyses) == ([], 0)
    look(100)
    look(199)
    assert world.status.phase == "Holding"
    assert event_reasons(world) == ["HoldingForEvidence"]
    look(1)
    assert (world.status.phase, world.status.canary_weight) == ("RolledBack", 0)
    assert world.status.rollout.message.startswith("ProgressDeadlineExceeded")
    assert "did not suffice within progressDeadline 5m after the interval" in (
        world.status.rollout.message
    )
