"""The liveness rule as pure functions, and its configuration section."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleetserve_runtime.cli import parse_config
from fleetserve_runtime.core.config_sections import HealthConfig
from fleetserve_runtime.core.liveness import (
    RunningBatch,
    Worker,
    judge,
    judge_worker,
    judge_workers,
    stuck_limit_s,
)

HEALTH = HealthConfig(stuck_batch_floor_s=30, stuck_batch_factor=10, loop_stall_s=5)
NOW = 1000.0


def batch(running_s: float, expected_s: float | None) -> RunningBatch:
    return RunningBatch(started=NOW - running_s, expected_s=expected_s)


def executor(running: RunningBatch | None) -> list[Worker]:
    return [Worker("executor", running)]


def generation(running: RunningBatch | None, *, alive: bool = True) -> Worker:
    return Worker("generation engine of version 'v1'", running, unit="step", alive=alive)


def test_an_idle_replica_with_a_prompt_loop_is_alive() -> None:
    """No running batch and no loop lag: alive."""
    assert judge(NOW, workers=executor(None), loop_lag_s=0.0, health=HEALTH).ok


@pytest.mark.parametrize(
    ("expected_s", "limit_s"),
    [
        pytest.param(None, 30, id="unmeasured-pace-uses-the-floor"),
        pytest.param(0.5, 30, id="fast-batches-use-the-floor"),
        pytest.param(7.0, 70, id="slow-batches-use-factor-times-expected"),
    ],
)
def test_a_batch_is_stuck_once_past_the_larger_of_floor_and_factor_times_expected(
    expected_s: float | None, limit_s: float
) -> None:
    """The limit is max(floor, factor x expected); a batch at it is alive, past it is not."""
    assert stuck_limit_s(expected_s, HEALTH) == limit_s
    at_limit = judge(
        NOW, workers=executor(batch(limit_s, expected_s)), loop_lag_s=0.0, health=HEALTH
    )
    past = judge(
        NOW, workers=executor(batch(limit_s + 0.5, expected_s)), loop_lag_s=0.0, health=HEALTH
    )
    assert at_limit.ok
    assert not past.ok
    assert past.reason.startswith("executor stuck: batch running for")
    assert f"limit of {limit_s:.1f}s" in past.reason


def test_the_reason_says_when_no_pace_was_measured() -> None:
    """Before any batch finished, the verdict says the expected time is unknown."""
    verdict = judge_workers(NOW, workers=executor(batch(31, None)), health=HEALTH)
    assert not verdict.ok
    assert "expected unmeasured" in verdict.reason


def test_a_stalled_loop_fails_even_when_the_executor_is_idle() -> None:
    """Loop lag over the limit fails liveness and names the stall."""
    verdict = judge(NOW, workers=executor(None), loop_lag_s=6.0, health=HEALTH)
    assert not verdict.ok
    assert verdict.reason == "event loop stalled for 6.0s (limit 5s)"
    assert judge(NOW, workers=executor(None), loop_lag_s=5.0, health=HEALTH).ok


def test_the_workers_half_ignores_the_loop() -> None:
    """The stalled-executor gauge reads only the workers' rule."""
    assert judge_workers(NOW, workers=executor(batch(1, 0.1)), health=HEALTH).ok
    assert not judge_workers(NOW, workers=executor(batch(31, 0.1)), health=HEALTH).ok


@pytest.mark.parametrize(
    ("expected_s", "limit_s"),
    [
        pytest.param(None, 30, id="unmeasured-pace-uses-the-floor"),
        pytest.param(7.0, 70, id="slow-steps-use-factor-times-expected"),
    ],
)
def test_a_generation_step_is_judged_by_the_rule_of_a_batch(
    expected_s: float | None, limit_s: float
) -> None:
    """A generation step past max(floor, factor x expected) fails, naming the step."""
    idle_executor = Worker("executor", None)
    at_limit = [idle_executor, generation(batch(limit_s, expected_s))]
    past = [idle_executor, generation(batch(limit_s + 0.5, expected_s))]
    assert judge(NOW, workers=at_limit, loop_lag_s=0.0, health=HEALTH).ok
    verdict = judge(NOW, workers=past, loop_lag_s=0.0, health=HEALTH)
    assert not verdict.ok
    assert verdict.reason.startswith(
        f"generation engine of version 'v1' stuck: step running for {limit_s + 0.5:.1f}s, "
        f"over its limit of {limit_s:.1f}s"
    )
    assert not judge_workers(NOW, workers=past, health=HEALTH).ok


def test_a_dead_worker_fails_even_when_idle() -> None:
    """A worker whose thread ended is never alive again, whatever it was running."""
    verdict = judge_worker(NOW, generation(None, alive=False), health=HEALTH)
    assert verdict == judge_workers(
        NOW, workers=[Worker("executor", None), generation(None, alive=False)], health=HEALTH
    )
    assert not verdict.ok
    assert verdict.reason == "generation engine of version 'v1' dead: its worker thread ended"
    assert judge_worker(NOW, generation(None), health=HEALTH).ok


def test_every_worker_is_judged_and_the_first_failure_is_reported() -> None:
    """One stuck worker among healthy ones fails; with several, the first one named wins."""
    healthy = [Worker("executor", batch(1, 0.1)), generation(batch(2, 0.1))]
    assert judge_workers(NOW, workers=healthy, health=HEALTH).ok
    assert judge_workers(NOW, workers=[], health=HEALTH).ok
    stuck_both = [Worker("executor", batch(40, None)), generation(batch(50, None))]
    verdict = judge_workers(NOW, workers=stuck_both, health=HEALTH)
    assert verdict.reason.startswith("executor stuck: batch running for 40.0s")
    only_generation = [healthy[0], generation(batch(50, None))]
    assert judge_workers(NOW, workers=only_generation, health=HEALTH).reason.startswith(
        "generation engine of version 'v1' stuck"
    )


def test_health_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The section's flags are `--health-...`; its env variables `FLEETSERVE_HEALTH_...`."""
    monkeypatch.setenv("FLEETSERVE_HEALTH_LOOP_STALL_S", "3")
    config = parse_config(
        ["--health-stuck-batch-floor-s", "12", "--health-stuck-batch-factor", "4"]
    )
    assert config.health == HealthConfig(
        stuck_batch_floor_s=12, stuck_batch_factor=4, loop_stall_s=3
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("stuck_batch_floor_s", 0), ("stuck_batch_factor", 0.5), ("loop_stall_s", -1)],
)
def test_bad_health_values_are_refused_naming_the_field(field: str, value: float) -> None:
    """A floor of 0, a factor below 1 or a negative stall limit stops start-up."""
    with pytest.raises(ValidationError, match=field):
        HealthConfig(**{field: value})
