"""Reads outside a canary analysis: the stable track's measured memory and its error ratio.

`sync` reads the runtime's measured memory figures for the memory-budget check, and the
stable track's 5xx ratio for the fallback trigger.
"""

from __future__ import annotations

from fleetserve_operator.analysis.prometheus import MetricSource, value_of
from fleetserve_operator.analysis.queries import (
    SERVER_ERRORS,
    TrackScope,
    code_ratio_query,
    memory_query,
)
from fleetserve_operator.contract import MemoryMetric
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.records import MemoryFigures

__all__ = ["read_memory_figures", "read_stable_error_ratio"]


def read_memory_figures(
    source: MetricSource, *, namespace: str, model: str, version: str
) -> MemoryFigures | None:
    """What the stable track measured for its model; None until a replica has reported it."""
    values = [
        source.query(memory_query(metric, namespace=namespace, model=model, version=version))
        for metric in (MemoryMetric.WEIGHTS, MemoryMetric.FIXED, MemoryMetric.PER_TOKEN)
    ]
    weights, fixed, per_token = values
    if weights is None or fixed is None or per_token is None:
        return None
    return MemoryFigures(weights_bytes=weights, fixed_bytes=fixed, bytes_per_token=per_token)


def read_stable_error_ratio(source: MetricSource, scope: TrackScope, window: str) -> float | None:
    """The stable track's 5xx ratio over `window` for the fallback trigger; None: no data.

    An unreachable Prometheus is no data too: failover on errors needs evidence (failover
    on missing replicas does not need Prometheus at all).
    """
    try:
        return value_of(source, code_ratio_query(scope, window, SERVER_ERRORS))
    except MetricsUnavailable:
        return None
