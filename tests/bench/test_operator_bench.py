"""The operator benchmark's report: the harness's JSON read strictly, the headline, the targets.

The run itself needs a control plane and KWOK (`make bench-operator`); the harness's pure parts
(audit counting, percentiles, KWOK's stages) are tested in `e2e/harness/test_operator_scale.py`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest
from fleetserve_e2e.control_plane_floor import Extras
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from bench.operator_bench import (
    FloorResult,
    ScaleResult,
    floor_argv,
    floor_table,
    harness_argv,
    headline,
    read_floor,
    read_result,
    table,
    target_line,
    verdicts,
)

FIGURES = {
    "services": 1000,
    "pods": 2000,
    "create_s": 31.5,
    "ready_s": 100.25,
    "settle_s": 30.0,
    "idle_window_s": 120.0,
    "idle_writes": 0,
    "idle_writes_per_min": 0.0,
    "idle_lease_writes_per_min": 20.0,
    "idle_dry_runs_per_min": 0.0,
    "idle_reads_per_min": 12.5,
    "idle_writes_by_kind": {},
    "changes": 50,
    "changes_seen": 50,
    "change_to_patch_p50_s": 0.12,
    "change_to_patch_p99_s": 0.8,
    "change_to_patch_max_s": 0.9,
    "rss_peak_mb": 310.4,
    "rss_idle_mb": 280.0,
    "cpu_s": 100.0,
    "cpu_idle_s": 1.0,
    "cpu_ready_s": 30.0,
    "machine_cpu_ready_s": 150.0,
    "ready_writes_by_kind": {"create deployments": 1000, "patch deployments": 1000},
    "ready_dry_runs": 3000,
    "ready_reads": 500,
    "reconciles_by_trigger": {"create": 1000.0, "child": 9000.0, "resync": 2000.0},
    "coalesced_events": 4000.0,
    "handover_changes": 10,
    "handover_changes_seen": 10,
    "handover_first_change_s": 3.0,
    "handover_change_p99_s": 1.5,
}

FLOOR = {
    "services": 1000,
    "children": 4000,
    "writers": 8,
    "extras": {"dry_runs": False, "status_writes": 0, "events": 0},
    "create_s": 30.0,
    "ready_s": 80.2,
    "machine_cpu_ready_s": 120.0,
    "driver_cpu_ready_s": 20.0,
}
FLOOR_RESULT = FloorResult(**{**FLOOR, "extras": Extras(**FLOOR["extras"])})


def test_headline_is_the_documented_last_line() -> None:
    result = ScaleResult(**FIGURES)
    assert headline(result) == (
        "services=1000 ready_s=100.2 idle_writes_per_min=0 change_to_patch_p99_s=0.800 rss_mb=310"
    )


def test_with_the_floor_the_headline_ends_with_it_and_the_ratio_over_it() -> None:
    assert headline(ScaleResult(**FIGURES), FLOOR_RESULT).endswith(
        "rss_mb=310 floor_ready_s=80.2 ready_over_floor=1.25"
    )


def test_a_floor_of_another_fleet_size_is_refused() -> None:
    with pytest.raises(ValueError, match="the floor ran 10 services, the bench 1000"):
        headline(ScaleResult(**FIGURES), replace(FLOOR_RESULT, services=10))


def _rows(rendered: Table) -> dict[str, list[str]]:
    """A rendered table's cells by their first column's text."""
    console = Console(width=200, record=True)
    console.print(rendered)
    cells = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in console.export_text().splitlines()
        if line.startswith("│")
    ]
    return {row[0]: row[1:] for row in cells}


def test_the_floor_table_puts_each_figure_beside_the_benchs() -> None:
    rows = _rows(floor_table(ScaleResult(**FIGURES), FLOOR_RESULT))
    assert rows["all Ready (s)"] == ["80.2", "100.2"]
    assert rows["until all Ready, the machine's CPU (s)"] == ["120.0", "150.0"]
    assert rows["until all Ready, the driver's / the operator's CPU (s)"] == ["20.0", "30.0"]
    assert rows["bench all Ready over the floor's"] == ["", "1.25"]


def test_the_table_gives_the_operators_share_of_the_machines_cpu() -> None:
    rows = _rows(table(ScaleResult(**FIGURES)))
    assert rows["until all Ready, the machine's CPU (s) / the operator's share"][0] == "150.0 / 20%"


def test_the_table_counts_merged_child_events_apart_from_the_reconciles_run() -> None:
    rows = _rows(table(ScaleResult(**FIGURES)))
    assert rows["reconciles by trigger"][0] == "child 9000, create 1000, resync 2000"
    assert rows["child events merged into a queued reconcile"][0] == "4000"


def test_a_change_never_seen_misses_the_latency_target() -> None:
    seen_all = ScaleResult(**FIGURES)
    missing = ScaleResult(**{**FIGURES, "changes_seen": 49})
    assert verdicts(seen_all) == {
        "ready_s": True,
        "cpu_ms_per_service": True,
        "idle_writes_per_min": True,
        "change_to_patch_p99_s": True,
        "handover_change_p99_s": True,
        "handover_first_change_s": True,
        "rss_peak_mb": True,
    }
    assert verdicts(missing)["change_to_patch_p99_s"] is False
    handover_missing = ScaleResult(**{**FIGURES, "handover_changes_seen": 9})
    assert verdicts(handover_missing)["handover_change_p99_s"] is False


def test_cpu_per_service_counts_until_all_ready_and_an_unmeasured_figure_misses() -> None:
    costly = ScaleResult(**{**FIGURES, "cpu_ready_s": 41.0})  # 41 ms for each of 1000
    assert verdicts(costly)["cpu_ms_per_service"] is False
    unmeasured = ScaleResult(**{**FIGURES, "handover_first_change_s": float("nan")})
    assert verdicts(unmeasured)["handover_first_change_s"] is False


def test_the_table_counts_the_requests_until_ready_for_each_service() -> None:
    console = Console(width=200, record=True)
    console.print(table(ScaleResult(**FIGURES)))
    text = console.export_text()
    assert "2.0 / 3.0 / 0.5" in text  # 2000 writes, 3000 dry-runs, 500 reads for 1000
    assert "create deployments 1000, patch deployments 1000" in text


def test_the_line_before_the_headline_names_every_target() -> None:
    line = target_line(ScaleResult(**{**FIGURES, "rss_peak_mb": 401.0}))
    assert line.startswith("targets: ready_s=100(<=120:ok) cpu_ms_per_service=30(<=40:ok)")
    assert "rss_peak_mb=401(<=400:NO)" in line
    assert "handover_first_change_s=3(<=5:ok)" in line


def test_one_idle_write_misses_the_idle_target() -> None:
    result = ScaleResult(**{**FIGURES, "idle_writes": 1, "idle_writes_per_min": 0.5})
    assert verdicts(result)["idle_writes_per_min"] is False


def test_the_harness_result_is_read_strictly() -> None:
    assert read_result(json.dumps(FIGURES)) == ScaleResult(**FIGURES)
    with pytest.raises(ValidationError):
        read_result(json.dumps({**FIGURES, "unexpected": 1}))
    assert read_floor(json.dumps(FLOOR)) == FLOOR_RESULT
    with pytest.raises(ValidationError):
        read_floor(json.dumps({**FLOOR, "unexpected": 1}))


def test_the_harness_gets_every_flag(tmp_path: Path) -> None:
    args = argparse.Namespace(
        services=5,
        changes=3,
        change_interval_s=0.1,
        handover_changes=2,
        settle_s=1.0,
        idle_window_s=10.0,
        operator_setting=["FLEETSERVE_WORKERS=4"],
        work_dir=tmp_path,
    )
    argv = harness_argv(args, tmp_path / "out.json")
    assert argv[1:3] == ["-m", "fleetserve_e2e.operator_scale"]
    assert "--services=5" in argv
    assert "--changes=3" in argv
    assert "--handover-changes=2" in argv
    assert "--idle-window-s=10.0" in argv
    assert "--operator-setting=FLEETSERVE_WORKERS=4" in argv
    assert f"--json={tmp_path / 'out.json'}" in argv
    assert f"--work-dir={tmp_path.resolve()}" in argv


def test_the_floor_runs_the_benchs_fleet_in_a_work_dir_of_its_own(tmp_path: Path) -> None:
    args = argparse.Namespace(services=5, work_dir=tmp_path)
    argv = floor_argv(args, tmp_path / "floor.json")
    assert argv[1:] == [
        "-m",
        "fleetserve_e2e.control_plane_floor",
        "--services=5",
        f"--json={tmp_path / 'floor.json'}",
        f"--work-dir={(tmp_path / 'floor').resolve()}",
    ]
