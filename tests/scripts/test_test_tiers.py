"""scripts/test-tiers.sh: every tier runs and gets a row with its time and CPU use."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-tiers.sh"
ROW = re.compile(
    r"^(?P<tier>\S+)\s+(?P<seconds>\d+)\s+(?P<busy>\d+%|bg)\s+(?P<result>passed|FAILED)$"
)

# Stands in for make: the tier `bad` fails, `spin` keeps one CPU busy for a second, `slow`
# sleeps for one, then says so and leaves $MARKER; `probe` tells whether `slow` had ended.
FAKE_MAKE = f"""#!/bin/sh
tier="$2"
case "$tier" in
  bad) exit 3 ;;
  slow) sleep 1; echo "slow is done"; touch "$MARKER" ;;
  probe) if [ -e "$MARKER" ]; then echo "probe: slow had ended"; else echo "probe: slow ran"; fi ;;
  spin) exec {sys.executable} -c "import time; end = time.monotonic() + 1.0
while time.monotonic() < end: pass" ;;
esac
"""


def run_tiers(tmp_path: Path, *tiers: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "make"
    fake.write_text(FAKE_MAKE)
    fake.chmod(0o755)
    return subprocess.run(
        ["bash", str(SCRIPT), *tiers],
        env={"MAKE": str(fake), "PATH": "/usr/bin:/bin", "MARKER": str(tmp_path / "slow-done")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def rows(stdout: str) -> dict[str, re.Match[str]]:
    found = (ROW.match(line) for line in stdout.splitlines())
    return {match["tier"]: match for match in found if match}


def test_a_failed_tier_does_not_stop_the_others_and_fails_the_run(tmp_path: Path) -> None:
    done = run_tiers(tmp_path, "bad", "good")

    assert done.returncode == 1
    table = rows(done.stdout)
    assert table["bad"]["result"] == "FAILED"
    assert table["good"]["result"] == "passed"
    assert "tiers: 1 passed, 1 failed" in done.stdout


def test_a_tier_that_computes_shows_the_cpus_busy(tmp_path: Path) -> None:
    done = run_tiers(tmp_path, "spin")

    assert done.returncode == 0, done.stderr
    spin = rows(done.stdout)["spin"]
    assert int(spin["seconds"]) >= 1
    assert 0 < int(spin["busy"].rstrip("%")) <= 100


def test_a_background_build_runs_beside_the_tiers_and_is_waited_for(tmp_path: Path) -> None:
    done = run_tiers(tmp_path, "bg:slow", "probe", "wait:slow", "after")

    assert done.returncode == 0, done.stderr
    table = rows(done.stdout)
    assert table["slow"]["busy"] == "bg"
    assert table["slow"]["result"] == "passed"
    assert int(table["slow"]["seconds"]) >= 1
    assert "probe: slow ran" in done.stdout
    assert done.stdout.index("slow is done") < done.stdout.index("=== tier after")
    assert "tiers: 3 passed, 0 failed" in done.stdout


def test_a_failed_background_build_fails_the_run(tmp_path: Path) -> None:
    done = run_tiers(tmp_path, "bg:bad", "good", "wait:bad")

    assert done.returncode == 1
    assert rows(done.stdout)["bad"]["result"] == "FAILED"


def test_a_background_build_never_waited_for_still_ends_before_the_table(tmp_path: Path) -> None:
    done = run_tiers(tmp_path, "bg:slow", "good")

    assert done.returncode == 0, done.stderr
    assert rows(done.stdout)["slow"]["result"] == "passed"
    assert done.stdout.index("slow is done") < done.stdout.index("tier           seconds")


def test_a_wait_for_a_build_never_started_fails(tmp_path: Path) -> None:
    done = run_tiers(tmp_path, "good", "wait:slow")

    assert done.returncode == 1
    assert rows(done.stdout)["slow"]["result"] == "FAILED"
