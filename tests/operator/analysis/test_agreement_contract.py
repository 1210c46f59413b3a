"""The shadow stage's queries against the runtime's own registry, as tests/contract/ does.

The operator may not import the runtime; its tests may, so the names the shadow stage
queries (`contract.SHADOW_*`) cannot drift from the series the stable pods export.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_operator.analysis.agreement import shadow_queries
from fleetserve_operator.analysis.queries import TrackScope
from fleetserve_operator.naming import Track
from fleetserve_runtime.core.metrics import ShadowMetrics


def test_the_queries_select_series_the_runtime_exports() -> None:
    """Every metric and label the shadow queries select exists in the runtime's registry."""
    registry = CollectorRegistry()
    ShadowMetrics(registry, model="m", track="stable").series("1", "2")
    exported = {
        sample.name: set(sample.labels)
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    scope = TrackScope(namespace="ns", model="m", version="1", track=Track.STABLE)
    for query in shadow_queries(scope, "2").values():
        name = query.removeprefix("sum(").partition("{")[0]
        assert name in exported, name
        assert {"model", "version", "track", "shadow_version"} <= exported[name]
