"""Operator → runtime: every autoscaling query reads a series the runtime exports, by its labels."""

from __future__ import annotations

import re

import pytest

from fleetserve_operator.naming import Track
from fleetserve_operator.render.scaling import scaling_query
from fleetserve_operator.spec import ScalingMetric
from fleetserve_runtime.core.metrics import RuntimeMetrics, StateSnapshot
from fleetserve_runtime.generate.metrics import GenerationMetrics

SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="')
SCRAPE_LABELS = {"namespace"}
"""Added by the scrape (a PodMonitor, the e2e file_sd), not by the runtime."""


def _exported() -> dict[str, set[str]]:
    """Sample name → its labels, for a runtime serving version 1 with the generative engine."""
    snapshot = StateSnapshot(0, 0, 0, 0, 0, 0, {})
    metrics = RuntimeMetrics(model="m", track=Track.STABLE.value, snapshot=lambda: snapshot)
    metrics.observe_batch("1", size=1, real_tokens=1, padded_tokens=1, queue_waits=[0.0],
                          compute_s=0.01)  # fmt: skip
    GenerationMetrics(metrics.registry, model="m", track=Track.STABLE.value).for_version("1")
    exported: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


@pytest.mark.parametrize("metric", list(ScalingMetric))
@pytest.mark.parametrize("track", [Track.STABLE, Track.FALLBACK])
def test_scaling_query_selects_exported_series(metric: ScalingMetric, track: Track) -> None:
    """The series each trigger selects exist, carrying every label it matches but `namespace`."""
    exported = _exported()
    query = scaling_query(metric, namespace="ns", model="m", track=track)
    selected = SELECTOR.findall(query)
    assert selected, query
    for name, matchers in selected:
        assert name in exported, f"{name} is queried but the runtime does not export it"
        labels = set(LABEL.findall(matchers))
        assert labels == {"namespace", "model", "track"}, "selected as the analysis selects"
        missing = labels - SCRAPE_LABELS - exported[name]
        assert not missing, f"{name} is queried by {sorted(missing)}, labels it does not carry"
