"""The bake after the last step: the canary carries all traffic, stable is its hot standby.

Every row of the `Baking` phase: the bake's start, its end on a passing analysis, the flip
back on a failure, a rejection, a crash or an abort, the commands, and no end on no data.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_operator import analysis, rollout
from fleetserve_operator.naming import Track
from fleetserve_operator.rollout import IncrementCounter, OperatorCounter
from fleetserve_operator.spec import (
    AnalysisResult,
    CheckOutcome,
    CheckResult,
    InferenceServiceStatus,
    RolloutCommand,
    RolloutPhase,
    Verdict,
)
from fleetserve_operator.testing import make_spec
from fleetserve_operator.testing.rollout import (
    World,
    changed,
    event_reasons,
    make_rollout_spec,
    stable_world,
    start_v2,
    weights,
)

BAKE = {"bake": "5m"}


def _baking(**knobs: Any) -> World:
    """v2 through its five 60 s steps: baking at 100%, v1's pods on standby."""
    world = stable_world(**(BAKE | knobs))
    start_v2(world)
    for _ in range(5):
        world.tick(60)
    assert world.status.phase == "Baking"
    return world


def _paused(world: World) -> bool:
    bake = world.status.rollout.bake
    assert bake is not None
    return bake.paused


def test_the_last_step_passing_starts_the_bake_with_stable_on_standby() -> None:
    """100% to the canary, stable still on v1 at its full size, the bake's window in status."""
    world = _baking()
    assert world.status.canary_weight == 100
    assert world.routes[-1] == {Track.STABLE: 0, Track.CANARY: 100, Track.FALLBACK: 0}
    assert [t.version for t in world.rolled(Track.STABLE)] == []
    assert world.stable is not None
    assert world.stable.spec_hash != world.spec.gpu_track.digest
    assert world.scales[-1] == (2, 2)
    bake = world.status.rollout.bake
    assert bake is not None
    assert (bake.since, bake.until) == ("2026-01-01T00:05:00Z", "2026-01-01T00:10:00Z")
    assert (bake.standby_version, bake.paused) == ("1", False)
    assert "Baking" in event_reasons(world)
    assert "version 1 on hot standby" in world.status.rollout.message


def test_a_passed_bake_runs_the_normal_promotion() -> None:
    """Passing analyses during the bake change nothing; the first one from its end promotes."""
    world = _baking()
    for _ in range(4):
        world.tick(60)
        assert world.status.phase == "Baking"
    world.tick(60)
    assert world.status.phase == "Promoting"
    assert world.status.rollout.bake is None
    assert [t.version for t in world.rolled(Track.STABLE)] == ["2"]
    world.tick()
    assert (world.status.phase, world.status.stable_version) == ("Succeeded", "2")
    assert weights(world) == [0, 1, 5, 20, 50, 100, 0]
    assert world.canary is None
    assert event_reasons(world).count("BakeCompleted") == 1
    assert world.of(IncrementCounter) == [IncrementCounter(OperatorCounter.PROMOTIONS, "Promoted")]
    assert [a.verdict for a in world.status.rollout.analyses] == ["Passed"] * 10


def test_a_failed_analysis_during_the_bake_flips_back_at_once() -> None:
    """One failed analysis (not `failureThreshold`): weights back to the running v1, no redeploy."""
    world = _baking()
    world.clear()
    world.metrics["errors"] = 0.5
    world.tick(60)
    assert world.status.phase == "RolledBack"
    assert world.routes[-1] == {Track.STABLE: 100, Track.FALLBACK: 0}
    assert world.templates == []  # stable kept v1's template: a weight change, not a redeploy
    assert world.status.rollout.bake is None
    assert world.status.stable_version == "1"
    message = world.status.rollout.message
    assert message.startswith("AnalysisFailed: version 2 withdrawn at 100%: during the bake")
    assert "error-rate" in message
    assert world.of(IncrementCounter) == [
        IncrementCounter(OperatorCounter.ROLLBACKS, "AnalysisFailed")
    ]
    assert event_reasons(world)[:2] == ["AnalysisFailed", "RolledBack"]


def test_a_sequential_rejection_during_the_bake_names_the_test() -> None:
    """A test's rejection is acted on at the look it happens, before the interval is over."""
    world = _baking()
    rejected = CheckResult(
        name="error-rate-vs-stable", value=500.0, max=400.0, outcome=CheckOutcome.REJECTED
    )
    result = AnalysisResult(
        verdict=Verdict.FAILED,
        message="error-rate-vs-stable e-value 500 >= 400",
        checks=[rejected],
    )
    world.clock.advance(5)
    facts = world.facts()
    transition = rollout.next_step(
        world.spec,
        world.status,
        type(facts)(stable=facts.stable, canary=facts.canary, analysis=result),
        world.clock.now,
    )
    assert transition.status.phase == "RolledBack"
    assert "error-rate-vs-stable e-value" in transition.status.rollout.message
    assert IncrementCounter(OperatorCounter.ROLLBACKS, "AnalysisRejected") in transition.actions


@pytest.mark.parametrize(
    ("crash", "reason"),
    [
        pytest.param({"oom_killed": True, "restarts": 1}, "CanaryOOMKilled", id="oom"),
        pytest.param({"restarts": 1}, "CanaryRestarted", id="restart"),
    ],
)
def test_a_canary_crash_during_the_bake_flips_back(crash: dict[str, Any], reason: str) -> None:
    """A crashed new version is not waited on: the standby takes the traffic back."""
    world = _baking()
    world.canary = changed(world.canary, **crash)
    world.tick()
    assert world.status.phase == "RolledBack"
    assert world.routes[-1][Track.STABLE] == 100
    assert world.of(IncrementCounter)[-1] == IncrementCounter(OperatorCounter.ROLLBACKS, reason)


def test_abort_during_the_bake_flips_back() -> None:
    """The abort annotation: the standby serves again, the canary goes."""
    world = _baking()
    world.command(RolloutCommand.ABORT, "now")
    assert (world.status.phase, world.status.canary_weight) == ("RolledBack", 0)
    assert world.routes[-1][Track.STABLE] == 100
    assert world.canary is None
    assert world.status.rollout.acknowledged[-1].result == "Baking -> RolledBack"


def test_promote_ends_the_bake_early() -> None:
    """`promote=full` during the bake: the normal promotion, now."""
    world = _baking()
    world.command(RolloutCommand.PROMOTE, "full")
    assert world.status.phase == "Promoting"
    assert "BakeEndedByHand" in event_reasons(world)
    assert [t.version for t in world.rolled(Track.STABLE)] == ["2"]


def test_promote_full_before_the_last_step_skips_the_bake() -> None:
    """`promote=full` is a person's decision to promote at once: past the bake too."""
    world = stable_world(**BAKE)
    start_v2(world)
    world.command(RolloutCommand.PROMOTE, "full")
    assert world.status.phase == "Promoting"


def test_promote_next_at_the_last_step_starts_the_bake() -> None:
    """`promote=next` takes the next step; after the last that is the bake."""
    world = stable_world(**BAKE)
    start_v2(world)
    for _ in range(4):
        world.tick(60)
    assert world.status.canary_weight == 100
    world.command(RolloutCommand.PROMOTE, "next")
    assert world.status.phase == "Baking"


def test_a_paused_bake_bakes_on_until_resumed() -> None:
    """Paused: past its end the bake goes on (and still flips back on failure); resume ends it."""
    world = _baking()
    world.command(RolloutCommand.PAUSE, "1")
    assert world.status.phase == "Baking"
    assert _paused(world)
    for _ in range(7):
        world.tick(60)
    assert world.status.phase == "Baking"
    world.command(RolloutCommand.RESUME, "1")
    assert not _paused(world)
    assert world.status.phase == "Baking"
    world.tick(60)
    assert world.status.phase == "Promoting"


def test_a_paused_bake_still_flips_back_on_failure() -> None:
    """Pausing never pauses safety."""
    world = _baking()
    world.command(RolloutCommand.PAUSE, "1")
    world.metrics["errors"] = 0.5
    world.tick(60)
    assert world.status.phase == "RolledBack"


def test_no_data_never_ends_the_bake() -> None:
    """Prometheus down past the bake's end: Baking on, each analysis inconclusive and said so."""
    world = _baking()
    world.prometheus_online = False
    for _ in range(8):
        world.tick(60)
    assert world.status.phase == "Baking"
    assert world.status.rollout.inconclusive_analyses == 8
    assert "never promoting without data" in world.status.rollout.message
    assert "AnalysisInconclusive" in event_reasons(world)
    world.prometheus_online = True
    world.tick(60)
    assert world.status.phase == "Promoting"


def test_a_new_spec_during_the_bake_restarts_the_rollout() -> None:
    """v3 during v2's bake: a fresh canary at weight 0, the bake gone."""
    world = _baking()
    world.spec = make_rollout_spec("3", **BAKE)
    world.tick()
    assert (world.status.phase, world.status.canary_version) == ("Starting", "3")
    assert world.status.rollout.bake is None


def test_reverting_the_spec_during_the_bake_cancels_it() -> None:
    """Back to v1's spec: its pods are still running, nothing failed."""
    world = _baking()
    world.spec = make_rollout_spec("1", **BAKE)
    world.tick()
    assert world.status.phase == "Succeeded"
    assert world.routes[-1][Track.STABLE] == 100


def test_the_standby_keeps_bake_standby_replicas() -> None:
    """`bakeStandbyReplicas` sizes the standby; the flip back restores the stable size."""
    world = _baking(bakeStandbyReplicas=1)
    assert world.scales[-1] == (1, 2)
    world.command(RolloutCommand.ABORT, "now")
    assert world.scales[-1] == (2, 0)


@pytest.mark.parametrize(
    ("knobs", "gpus", "expected"),
    [
        pytest.param({}, 1, (4, 4), id="default-full-size"),
        pytest.param({"bakeStandbyReplicas": 2}, 1, (2, 4), id="chosen"),
        pytest.param({"maxSurgeGPUs": 2}, 1, (2, 4), id="surge-bound"),
        pytest.param({"maxSurgeGPUs": 0}, 1, (1, 4), id="surge-0-keeps-one"),
        pytest.param({"maxSurgeGPUs": 0}, 0, (4, 4), id="cpu-ignores-surge"),
    ],
)
def test_standby_size(knobs: dict[str, Any], gpus: int, expected: tuple[int, int]) -> None:
    """Full size by default; `maxSurgeGPUs` bounds it, but a standby keeps one replica."""
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    spec = make_spec(
        runtime={"replicas": {"min": 4, "max": 4}, "resources": {"limits": limits}},
        rollout={"bake": "10m", **knobs},
    )
    status = InferenceServiceStatus(phase=RolloutPhase.BAKING, canary_weight=100)
    plan = rollout.plan_capacity(spec, status, stable_replicas=4)
    assert (plan.stable, plan.canary) == expected


def test_the_bake_is_judged_against_stables_baseline_as_the_last_step() -> None:
    """The analysis target of the bake is the 100% step's: canary alone (baseline), gated."""
    world = _baking()
    target = analysis.target_for(world.spec, world.status, namespace="ns")
    assert target.canary_alone
    assert target.gated
    assert target.stable.offset == world.spec.rollout.interval
    assert rollout.is_watching(world.status)


def test_threshold_mode_reads_stables_window_as_of_the_bakes_start() -> None:
    """Stable serves nothing during the bake: its window is the one the 100% step passed on.

    A window read `offset` before now would, after the bake's first interval, fall in the
    bake itself and find no stable data: no verdict, and a bake that never ends.
    """
    world = _baking()
    world.tick(180)
    assert world.status.phase == "Baking"
    target = analysis.target_for(world.spec, world.status, namespace="ns")
    bake = world.status.rollout.bake
    assert bake is not None
    assert target.stable.at == bake.since
    query = analysis.p99_ms_query("m", target.stable, target.window)
    assert query.endswith("[60s] offset 60s @ 1767225900)))"), query
    assert "@" not in analysis.p99_ms_query("m", target.canary, target.window)


def test_a_bake_restart_resumes_it() -> None:
    """Status written and read back mid-bake (an operator restart) resumes the same bake."""
    world = _baking()
    world.tick(30)
    stored = world.status.model_dump(by_alias=True, exclude_none=True, mode="json")
    restarted = InferenceServiceStatus.model_validate(stored)
    again = rollout.next_step(world.spec, restarted, world.facts(), world.clock.now)
    assert (again.status, again.actions) == (restarted, ())


def test_without_bake_the_last_step_promotes_at_once() -> None:
    """`rollout.bake` unset: no Baking phase, as before."""
    world = stable_world()
    start_v2(world)
    for _ in range(5):
        world.tick(60)
    assert world.status.phase == "Promoting"
    assert world.status.rollout.bake is None
