"""Run a benchmark module the way ``make bench-*`` does, for the smoke tests in tests/bench.

Each smoke test starts the real command in a child interpreter from the repository root and
reads what it printed, so a broken CLI or a wrong closing line fails the test.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["run_bench"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_bench(
    module: str,
    args: Sequence[str] = (),
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Run ``python -m module args`` and return its stdout lines.

    Raises:
        AssertionError: the command exited non-zero (the message holds its stderr tail).
        subprocess.TimeoutExpired: it ran past `timeout_s`.
    """
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()
