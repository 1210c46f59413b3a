"""The analysis benchmark's power table: whole rollouts through the operator's own path.

Seeded and in simulated time. A canary three times as likely to fail as stable is never
promoted; an A/A canary is promoted, at low traffic and short steps too; the report ends with
`promoted_at_3x_errors=` and `false_rollback_rate=`.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.analysis_bench import Rollout, main, roll_out


@pytest.mark.parametrize("rate_rps", [50.0, 500.0])
def test_a_canary_failing_three_times_as_often_is_never_promoted(rate_rps: float) -> None:
    """1% → 3% errors, steps of 4 s: 30 canaries, none reaches promotion."""
    rng = np.random.default_rng(21)
    decisions = [roll_out(Rollout(rate_rps=rate_rps, interval_s=4.0, error_factor=3.0), rng)
                 for _ in range(30)]  # fmt: skip
    assert {d.outcome for d in decisions} == {"rolled_back"}


def test_an_aa_canary_at_low_traffic_is_held_for_evidence_then_promoted() -> None:
    """50 requests/s, 4 s steps: promoted, after the 50% step held for its evidence."""
    rng = np.random.default_rng(22)
    decisions = [roll_out(Rollout(rate_rps=50.0, interval_s=4.0), rng) for _ in range(30)]
    assert {d.outcome for d in decisions} == {"promoted"}
    assert min(d.at_s for d in decisions) > 4 * 5.0, "four 4 s steps alone take 20 s"


def test_a_p99_twice_stables_is_never_promoted() -> None:
    """The slowest 2% of answers twice as slow, 500 requests/s: rolled back, every one."""
    rng = np.random.default_rng(23)
    rollout = Rollout(rate_rps=500.0, interval_s=4.0, tail_factor=2.0)
    assert {roll_out(rollout, rng).outcome for _ in range(30)} == {"rolled_back"}


def test_the_report_ends_with_the_headline(capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny run: the power table's lines, then the two headline lines last."""
    main(["--canaries", "20", "--regressed", "5", "--rollouts", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("power regression=") for line in lines) == 9 * 6
    assert lines[-2].startswith("promoted_at_3x_errors=")
    assert lines[-1].startswith("false_rollback_rate=")
    assert float(lines[-2].split("=")[1]) == 0.0
