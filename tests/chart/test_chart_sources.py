"""The chart's alert rules and dashboards name only series that really exist.

Reads the unrendered sources, so it needs no helm and covers every template branch and every
dashboard file: renaming a runtime or operator metric breaks the chart here, not on a pager.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_runtime.core.metrics import RuntimeMetrics, StateSnapshot

CHART = Path(__file__).resolve().parents[2] / "charts" / "fleetserve"


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry exposes, with the suffixes of its metric types."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in suffixes.get(family.type, [""])
    }


def spelled_series(text: str) -> set[str]:
    """The fleetserve_* series names a chart file spells, outside its YAML and Go comments."""
    text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", text, flags=re.DOTALL)
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return set(re.findall(r"\bfleetserve_[a-z0-9_]+", code))


def test_every_metric_name_in_the_chart_sources_is_exported() -> None:
    """The rule template and every dashboard file spell only series the programs export."""
    snapshot = StateSnapshot(0, 0, 0, 0, 0, 0, {})
    runtime = RuntimeMetrics(model="m", track="stable", snapshot=lambda: snapshot)
    known = exposed_names(runtime.registry) | exposed_names(OperatorMetrics().registry)
    sources = [
        CHART / "templates" / "prometheusrule.yaml",
        *sorted(CHART.glob("dashboards/*.json")),
    ]
    assert len(sources) > 1, "no dashboard found"
    for source in sources:
        used = spelled_series(source.read_text())
        assert used, f"no fleetserve_* series in {source.name}"
        assert used <= known, f"{source.name} spells unexported series: {sorted(used - known)}"
