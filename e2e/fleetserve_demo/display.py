"""What the demo shows: the rollout's state and every canary analysis, as rich renderables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from fleetserve_e2e.loadgen import LoadDriver

_VERDICT_STYLE = {"Passed": "green", "Failed": "bold red", "Inconclusive": "yellow"}


def _check(analysis: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next((c for c in analysis.get("checks", []) if c["name"] == name), {})


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


@dataclass
class AnalysisRow:
    """One analysis as the demo shows it: values from `status.rollout.analyses[]`."""

    time: str
    weight: int | None
    verdict: str
    requests: float | None
    error_ratio: float | None
    p99_ms: float | None
    ratio_vs_stable: float | None
    note: str

    @classmethod
    def parse(cls, analysis: Mapping[str, Any], latency_factor: float) -> AnalysisRow:
        """Read one analysis; the ratio is canary p99 / stable p99, from the check's bound."""
        versus = _check(analysis, "p99-latency-vs-stable")
        # The check's max is stable's p99 times the allowed factor; undo the factor.
        ratio = None
        if versus.get("value") is not None and versus.get("max"):
            ratio = versus["value"] * latency_factor / versus["max"]
        return cls(
            time=str(analysis.get("time", "")),
            weight=analysis.get("weight"),
            verdict=analysis["verdict"],
            requests=analysis.get("requests"),
            error_ratio=_check(analysis, "error-rate").get("value"),
            p99_ms=_check(analysis, "p99-latency").get("value", versus.get("value")),
            ratio_vs_stable=ratio,
            # A pass repeats the values shown in the columns; a failure says which bound broke.
            note=""
            if analysis["verdict"] == "Passed"
            else analysis.get("reason") or analysis.get("message", ""),
        )

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values (the demo's final result line)."""
        return {
            "weight": self.weight,
            "verdict": self.verdict,
            "requests": self.requests,
            "error_ratio": self.error_ratio,
            "p99_ms": self.p99_ms,
            "p99_ratio_vs_stable": self.ratio_vs_stable,
        }

    def describe(self) -> str:
        """One line for the log above the live display."""
        return (
            f"analysis at {self.weight}%: [{_VERDICT_STYLE.get(self.verdict, '')}]"
            f"{self.verdict}[/] requests={_number(self.requests, '.0f')} "
            f"error_ratio={_number(self.error_ratio, '.3f')} p99={_number(self.p99_ms, '.1f')}ms "
            f"vs_stable={_number(self.ratio_vs_stable, '.2f')}x {self.note}"
        ).rstrip()


@dataclass
class RolloutView:
    """Everything seen of one rollout: the latest status and each analysis once."""

    title: str
    steps: list[int]
    latency_factor: float
    status: dict[str, Any] = field(default_factory=dict)
    rows: list[AnalysisRow] = field(default_factory=list)
    weights_seen: list[int] = field(default_factory=list)
    earlier: set[str] = field(default_factory=set)

    def skip_earlier(self, status: dict[str, Any]) -> None:
        """Ignore the analyses already in `status`: they judged the previous rollout."""
        self.earlier = {
            str(a.get("time", "")) for a in status.get("rollout", {}).get("analyses", [])
        }

    def update(self, status: dict[str, Any]) -> tuple[list[AnalysisRow], int | None]:
        """Take a new status; return the analyses not seen before and a new canary weight."""
        self.status = status
        seen = self.earlier | {row.time for row in self.rows}
        new = [
            AnalysisRow.parse(a, self.latency_factor)
            for a in status.get("rollout", {}).get("analyses", [])
            if str(a.get("time", "")) not in seen
        ]
        self.rows.extend(new)
        weight = status.get("canaryWeight", 0)
        moved = None
        if weight and (not self.weights_seen or self.weights_seen[-1] != weight):
            self.weights_seen.append(weight)
            moved = weight
        return new, moved

    def render(self, load: LoadDriver) -> Group:
        """The header (phase, versions, weight bar, traffic) and the analysis table."""
        status = self.status
        weight = status.get("canaryWeight", 0)
        header = Text.from_markup(
            f"[bold]{self.title}[/]   phase [cyan]{status.get('phase', '-')}[/]   "
            f"stable v{status.get('stableVersion', '-')}   "
            f"canary v{status.get('canaryVersion') or '-'}   canary weight [bold]{weight}%[/]"
        )
        steps = Text("steps  ")
        for step in self.steps:
            style = "bold green" if step in self.weights_seen else "dim"
            steps.append(f"{step}% ", style=style)
        table = Table(expand=False, header_style="bold")
        for column in ("weight", "verdict", "requests", "error ratio", "p99 ms", "p99/stable"):
            table.add_column(column, justify="right")
        table.add_column("note")
        for row in self.rows:
            style = _VERDICT_STYLE.get(row.verdict, "")
            table.add_row(
                f"{row.weight}%",
                Text(row.verdict, style=style),
                _number(row.requests, ".0f"),
                _number(row.error_ratio, ".3f"),
                _number(row.p99_ms, ".1f"),
                _number(row.ratio_vs_stable, ".2f"),
                row.note[:60],
            )
        return Group(
            header,
            ProgressBar(total=100, completed=weight, width=60),
            steps,
            Text(traffic_line(load), style="dim"),
            table,
        )


def traffic_line(load: LoadDriver) -> str:
    """Requests sent per track and how many failed, from the load driver's records."""
    records = list(load.records)
    parts = []
    for track in ("stable", "canary", "fallback"):
        mine = [r for r in records if r.track == track]
        if mine:
            failed = sum(r.is_server_error for r in mine)
            parts.append(f"{track} {len(mine)} ({failed} failed)")
    return "traffic: " + (", ".join(parts) or "none yet") + f"   route {load.weights}"
