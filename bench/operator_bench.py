"""The operator at 1000 InferenceServices, against the targets in `TARGETS`.

The run itself is the e2e harness's (`e2e/fleetserve_e2e/operator_scale.py`): a local
control plane with KWOK nodes (2 synthetic replicas per service, no pod processes), the real
operator under its shipped RBAC, the API server's audit log counting the operator's
requests. This module starts it as `python -m fleetserve_e2e.operator_scale` in `e2e/`
(the harness is not an installed package: `make bench-operator` puts `e2e/` on the path, so
the result is read with the harness's own `ScaleResult`), reads its JSON result and reports
it: a table, the JSON, a line with every target's figure (`targets: name=value(<=bound:ok)`,
NO where missed), and the headline as the last line,
`services=… ready_s=… idle_writes_per_min=… change_to_patch_p99_s=… rss_mb=…`, ending
`floor_ready_s=… ready_over_floor=…` when the floor ran.

The floor (`fleetserve_e2e.control_plane_floor`, run first unless `--no-floor`) is the same
fleet in a fresh cluster of the same shape with the children made by the driver and no
operator: the time this machine's control plane needs whatever the operator does.
`ready_over_floor` is the bench's all-Ready time over it, measured side by side.

`--services 5 --idle-window-s 10` is a smoke run of a minute or so.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from fleetserve_e2e.control_plane_floor import FloorResult
from fleetserve_e2e.operator_scale import ScaleConfig, ScaleResult, knob_flag
from pydantic import TypeAdapter
from rich.console import Console
from rich.table import Table

E2E_DIR = Path(__file__).resolve().parent.parent / "e2e"

_RESULT = TypeAdapter(ScaleResult)
_FLOOR = TypeAdapter(FloorResult)
PASSED_ON = {
    "services": "InferenceServices (N)",
    "changes": "spec changes timed (M)",
    "change_interval_s": "pace of changes",
    "handover_changes": "changes timed across a leader hand-over (0: none)",
    "settle_s": "quiet period (no write) before idle counts",
    "idle_window_s": "idle count window",
}
"""The harness's knobs this command passes on, with their help; the defaults are the harness's."""
TARGETS = {
    "ready_s": 120.0,
    "cpu_ms_per_service": 40.0,
    "idle_writes_per_min": 0.0,
    "change_to_patch_p99_s": 1.0,
    "handover_change_p99_s": 2.0,
    "handover_first_change_s": 5.0,
    "rss_peak_mb": 400.0,
}
"""Each figure's upper bound, on a 2-core machine."""


def read_result(text: str) -> ScaleResult:
    """The harness's JSON, read strictly: a field this report does not know is an error."""
    return _RESULT.validate_json(text, extra="forbid")


def read_floor(text: str) -> FloorResult:
    """The floor's JSON, read as strictly as the bench's."""
    return _FLOOR.validate_json(text, extra="forbid")


def headline(result: ScaleResult, floor: FloorResult | None = None) -> str:
    """The last line of the report."""
    line = (
        f"services={result.services} ready_s={result.ready_s:.1f} "
        f"idle_writes_per_min={result.idle_writes_per_min:g} "
        f"change_to_patch_p99_s={result.change_to_patch_p99_s:.3f} "
        f"rss_mb={result.rss_peak_mb:.0f}"
    )
    if floor is None:
        return line
    return (
        f"{line} floor_ready_s={floor.ready_s:.1f} ready_over_floor={over_floor(result, floor):.2f}"
    )


def over_floor(result: ScaleResult, floor: FloorResult) -> float:
    """The bench's all-Ready time over the floor's, for the same number of services."""
    if floor.services != result.services:
        raise ValueError(f"the floor ran {floor.services} services, the bench {result.services}")
    return result.ready_s / floor.ready_s


def figures(result: ScaleResult) -> dict[str, float]:
    """The value of each target's figure (a change never seen counts as infinitely late)."""
    missed = result.changes_seen < result.changes
    handover_missed = result.handover_changes_seen < result.handover_changes
    return {
        "ready_s": result.ready_s,
        "cpu_ms_per_service": 1000.0 * result.cpu_ready_s / max(1, result.services),
        "idle_writes_per_min": result.idle_writes_per_min,
        "change_to_patch_p99_s": math.inf if missed else result.change_to_patch_p99_s,
        "handover_change_p99_s": math.inf if handover_missed else result.handover_change_p99_s,
        "handover_first_change_s": result.handover_first_change_s,
        "rss_peak_mb": result.rss_peak_mb,
    }


def verdicts(result: ScaleResult) -> dict[str, bool]:
    """Whether each target is met (NaN, a figure not measured, is not)."""
    return {name: value <= TARGETS[name] for name, value in figures(result).items()}


def target_line(result: ScaleResult) -> str:
    """The line before the headline: every target's figure, its bound and whether it is met."""
    met = verdicts(result)
    return "targets: " + " ".join(
        f"{name}={value:.3g}(<={TARGETS[name]:g}:{'ok' if met[name] else 'NO'})"
        for name, value in figures(result).items()
    )


def table(result: ScaleResult) -> Table:
    """The figures, each with its target where it has one."""
    met = verdicts(result)
    values = figures(result)
    rows: list[tuple[str, str, str]] = [
        ("services / pods", f"{result.services} / {result.pods}", ""),
        ("create all (s)", f"{result.create_s:.1f}", ""),
        ("all Ready (s)", f"{result.ready_s:.1f}", "≤ 120"),
        ("then until no write for the quiet period (s)", f"{result.settle_s:.1f}", ""),
        ("idle writes / min", f"{result.idle_writes_per_min:g}", "0"),
        ("idle Lease renewals / min", f"{result.idle_lease_writes_per_min:g}", ""),
        ("idle dry-runs / min", f"{result.idle_dry_runs_per_min:g}", ""),
        ("idle reads / min", f"{result.idle_reads_per_min:g}", ""),
        (
            "change → patch p50 / p99 / max (s)",
            f"{result.change_to_patch_p50_s:.3f} / {result.change_to_patch_p99_s:.3f}"
            f" / {result.change_to_patch_max_s:.3f}",
            "p99 ≤ 1",
        ),
        ("changes seen", f"{result.changes_seen}/{result.changes}", ""),
        ("RSS peak / idle (MB)", f"{result.rss_peak_mb:.0f} / {result.rss_idle_mb:.0f}", "≤ 400"),
        ("CPU total / idle window (s)", f"{result.cpu_s:.1f} / {result.cpu_idle_s:.1f}", ""),
        ("CPU until all Ready, per service (ms)", f"{values['cpu_ms_per_service']:.1f}", "≤ 40"),
        (
            "hand-over: first change / p99 during the replay (s)",
            f"{result.handover_first_change_s:.3f} / {result.handover_change_p99_s:.3f}"
            f" ({result.handover_changes_seen}/{result.handover_changes} seen)",
            "≤ 5 / ≤ 2",
        ),
        ("reconciles by trigger", _counts(result.reconciles_by_trigger), ""),
        ("child events merged into a queued reconcile", f"{result.coalesced_events:g}", ""),
        ("until all Ready, per service: writes / dry-runs / reads", _per_service(result), ""),
        ("until all Ready, writes by kind", _counts(result.ready_writes_by_kind), ""),
        (
            "until all Ready, the machine's CPU (s) / the operator's share",
            f"{result.machine_cpu_ready_s:.1f} / "
            f"{result.cpu_ready_s / max(result.machine_cpu_ready_s, 1e-9):.0%}",
            "",
        ),
    ]
    marks = {
        2: ("ready_s",),
        4: ("idle_writes_per_min",),
        8: ("change_to_patch_p99_s",),
        10: ("rss_peak_mb",),
        12: ("cpu_ms_per_service",),
        13: ("handover_first_change_s", "handover_change_p99_s"),
    }
    out = Table(title=f"fleetserve-operator, {result.services} InferenceServices on KWOK")
    for column in ("figure", "value", "target", "met"):
        out.add_column(column, justify="left" if column == "figure" else "right")
    for index, (name, value, target) in enumerate(rows):
        keys = marks.get(index, ())
        verdict = " / ".join("yes" if met[key] else "NO" for key in keys)
        out.add_row(name, value, target, verdict)
    return out


def floor_table(result: ScaleResult, floor: FloorResult) -> Table:
    """The floor's figures beside the bench's."""
    out = Table(title=f"the control plane's floor: {floor.services} services, no operator")
    out.add_column("figure", justify="left")
    for column in ("floor", "bench"):
        out.add_column(column, justify="right")
    out.add_row("create all (s)", f"{floor.create_s:.1f}", f"{result.create_s:.1f}")
    out.add_row("all Ready (s)", f"{floor.ready_s:.1f}", f"{result.ready_s:.1f}")
    out.add_row(
        "until all Ready, the machine's CPU (s)",
        f"{floor.machine_cpu_ready_s:.1f}",
        f"{result.machine_cpu_ready_s:.1f}",
    )
    out.add_row(
        "until all Ready, the driver's / the operator's CPU (s)",
        f"{floor.driver_cpu_ready_s:.1f}",
        f"{result.cpu_ready_s:.1f}",
    )
    out.add_row("children created (floor: by the driver)", f"{floor.children}", "")
    out.add_row("bench all Ready over the floor's", "", f"{over_floor(result, floor):.2f}")
    return out


def _counts(counts: Mapping[str, float]) -> str:
    return ", ".join(f"{key} {value:g}" for key, value in sorted(counts.items())) or "-"


def _per_service(result: ScaleResult) -> str:
    """The operator's requests until all Ready, for each service created."""
    writes = sum(result.ready_writes_by_kind.values())
    counts = (writes, result.ready_dry_runs, result.ready_reads)
    return " / ".join(f"{count / max(1, result.services):.1f}" for count in counts)


def print_report(
    result: ScaleResult, floor: FloorResult | None, *, context: Mapping[str, object]
) -> None:
    """Print the tables, the JSON (with `context`), every target's figure, then the headline."""
    console = Console(width=120)
    console.print(table(result))
    report = {"context": dict(context), "result": asdict(result)}
    if floor is not None:
        console.print(floor_table(result, floor))
        report["floor"] = asdict(floor)
    print(json.dumps(report, indent=2))
    print(target_line(result))
    print(headline(result, floor))


def harness_argv(args: argparse.Namespace, json_path: Path) -> list[str]:
    """The `fleetserve_e2e.operator_scale` command line for `args`."""
    flags = [f"{knob_flag(name)}={getattr(args, name)}" for name in PASSED_ON]
    flags += [f"--operator-setting={item}" for item in args.operator_setting]
    return _module_argv("fleetserve_e2e.operator_scale", flags, json_path, args.work_dir)


def floor_argv(args: argparse.Namespace, json_path: Path) -> list[str]:
    """The `fleetserve_e2e.control_plane_floor` command line for `args`."""
    work_dir = None if args.work_dir is None else args.work_dir / "floor"
    flags = [f"--services={args.services}"]
    return _module_argv("fleetserve_e2e.control_plane_floor", flags, json_path, work_dir)


def _module_argv(
    module: str, flags: list[str], json_path: Path, work_dir: Path | None
) -> list[str]:
    argv = [sys.executable, "-m", module, *flags, f"--json={json_path}"]
    if work_dir is not None:
        argv.append(f"--work-dir={work_dir.resolve()}")
    return argv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_bench", description=__doc__)
    defaults = ScaleConfig()
    for name, help_text in PASSED_ON.items():
        default = getattr(defaults, name)
        parser.add_argument(knob_flag(name), type=type(default), default=default, help=help_text)
    parser.add_argument(
        "--operator-setting", action="append", default=[], metavar="FLEETSERVE_X=VALUE"
    )
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first measure the control plane's floor for the same fleet (a few minutes)",
    )
    parser.add_argument("--work-dir", type=Path, help="keep the cluster's logs here")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Run the harness once and report."""
    args = _parser().parse_args(argv)
    floor = None
    with tempfile.TemporaryDirectory(prefix="operator-bench-") as scratch:
        if args.floor:
            floor_path = Path(scratch) / "floor.json"
            subprocess.run(floor_argv(args, floor_path), cwd=E2E_DIR, check=True)
            floor = read_floor(floor_path.read_text(encoding="utf-8"))
        json_path = Path(scratch) / "result.json"
        subprocess.run(harness_argv(args, json_path), cwd=E2E_DIR, check=True)
        result = read_result(json_path.read_text(encoding="utf-8"))
    context = {"argv": sys.argv[1:], "operator_settings": args.operator_setting}
    print_report(result, floor, context=context)


if __name__ == "__main__":
    main()
