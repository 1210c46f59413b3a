"""Smoke test of `bench.http_overhead_bench`: both servers answer, the ratio is printed last."""

from __future__ import annotations

import pytest

from bench.testing import run_bench


@pytest.mark.timeout(240)
def test_tiny_run_measures_both_servers() -> None:
    """Real servers, a few requests each: no errors in either row, the ratio last."""
    lines = run_bench(
        "bench.http_overhead_bench",
        ["--requests=40", "--warmup=8", "--concurrency=4", "--time-limit-s=60"],
        timeout_s=230,
    )
    rows = {
        line.split()[0]: line.split() for line in lines if line.startswith(("bare ", "runtime "))
    }
    assert set(rows) == {"bare", "runtime"}
    assert all(row[-1] == "0" for row in rows.values()), rows
    assert all(float(row[1]) > 0 for row in rows.values()), rows
    assert lines[-1].startswith("http_overhead_ratio=")
    assert float(lines[-1].partition("=")[2]) > 0
