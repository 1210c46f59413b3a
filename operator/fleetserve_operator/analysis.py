"""Metric reads from Prometheus behind a small `MetricSource` protocol.

`handlers` reads the runtime's measured memory figures here for the memory-budget check;
the rollout's canary analysis (issue 5) builds on the same protocol. Tests feed numbers
through `testing.FakeMetricSource` instead of a Prometheus. "No data" (None) is its own
outcome, never a failure; an unreachable Prometheus raises `MetricsUnavailable`.
"""

from __future__ import annotations

from typing import Protocol

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from fleetserve_operator.contract import MemoryMetric
from fleetserve_operator.errors import MetricsUnavailable
from fleetserve_operator.naming import Track
from fleetserve_operator.observe import MemoryFigures

__all__ = ["MetricSource", "PrometheusSource", "memory_query", "read_memory_figures"]


class MetricSource(Protocol):
    """Where PromQL results come from."""

    def query(self, promql: str) -> float | None:
        """The single value of an instant query; None when it returns no series."""
        ...

    def is_online(self) -> bool:
        """Whether the source answers at all."""
        ...


class PrometheusSource:
    """A `MetricSource` over Prometheus's HTTP API (prometheus-api-client)."""

    def __init__(self, url: str, *, timeout_s: int = 5) -> None:
        # No client-side retries: a failed query is an inconclusive check, and the next
        # reconcile asks again; retrying here would only stall the reconcile.
        self._prometheus = PrometheusConnect(url=url, timeout=timeout_s, retry=Retry(total=0))
        self.url = url

    def query(self, promql: str) -> float | None:
        """The first series' value of `promql`; raises `MetricsUnavailable` on any failure."""
        try:
            result = self._prometheus.custom_query(promql)
        except (PrometheusApiClientException, requests.RequestException) as exc:
            raise MetricsUnavailable(f"{self.url}: {promql}: {exc}") from exc
        if not result:
            return None
        return float(result[0]["value"][1])

    def is_online(self) -> bool:
        """Whether Prometheus answers its health check."""
        try:
            return bool(self._prometheus.check_prometheus_connection())
        except requests.RequestException:
            return False


def memory_query(metric: str, *, namespace: str, model: str, version: str) -> str:
    """PromQL for one memory gauge of the stable track of `model` at `version`.

    `namespace` is the scrape target's namespace label (added by Kubernetes service
    discovery, a PodMonitor, or the e2e harness); the runtime adds model/version/track.
    """
    selector = f'namespace="{namespace}",model="{model}",version="{version}",track="{Track.STABLE}"'
    return f"max({metric}{{{selector}}})"


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
