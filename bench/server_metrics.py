"""Scrape the runtime's ``/metrics`` and take deltas over a measured window.

``bench.runtime_bench`` snapshots the counters before and after each measured run; the
difference covers exactly the measured requests, because nothing else talks to the server
in between. Samples are summed across label sets (model, version, track, ...).
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

BATCH_ITEMS = "fleetserve_batch_size_sum"
BATCHES = "fleetserve_batch_size_count"
REAL_TOKENS = "fleetserve_batch_tokens_real_total"
PADDED_TOKENS = "fleetserve_batch_tokens_padded_total"
REQUESTS = "fleetserve_requests_total"


@dataclass(frozen=True)
class ServerCounters:
    """The runtime's batching counters at one instant, or the change between two instants.

    Attributes:
        batch_items: Requests placed in batches (sum of the batch-size histogram).
        batches: Batches run (count of the batch-size histogram).
        real_tokens: Tokens of the requests themselves.
        padded_tokens: Tokens the model computed, padding included.
        requests_by_code: Answered requests per HTTP status code.
    """

    batch_items: float
    batches: float
    real_tokens: float
    padded_tokens: float
    requests_by_code: Mapping[str, float]

    @classmethod
    def parse(cls, text: str) -> ServerCounters:
        """Read the counters from Prometheus text exposition format."""
        totals: defaultdict[str, float] = defaultdict(float)
        by_code: defaultdict[str, float] = defaultdict(float)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] += sample.value
                if sample.name == REQUESTS:
                    by_code[sample.labels.get("code", "?")] += sample.value
        return cls(
            batch_items=totals[BATCH_ITEMS],
            batches=totals[BATCHES],
            real_tokens=totals[REAL_TOKENS],
            padded_tokens=totals[PADDED_TOKENS],
            requests_by_code=dict(by_code),
        )

    def __sub__(self, earlier: ServerCounters) -> ServerCounters:
        """Return the change from ``earlier`` to this snapshot."""
        codes = self.requests_by_code.keys() | earlier.requests_by_code.keys()
        return ServerCounters(
            batch_items=self.batch_items - earlier.batch_items,
            batches=self.batches - earlier.batches,
            real_tokens=self.real_tokens - earlier.real_tokens,
            padded_tokens=self.padded_tokens - earlier.padded_tokens,
            requests_by_code={
                code: self.requests_by_code.get(code, 0.0) - earlier.requests_by_code.get(code, 0.0)
                for code in sorted(codes)
            },
        )

    @property
    def mean_batch_size(self) -> float:
        """Requests per batch (0 when no batch ran)."""
        return self.batch_items / self.batches if self.batches else 0.0

    @property
    def padding_efficiency(self) -> float:
        """Real tokens over computed tokens (0 when nothing was computed)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


def scrape(base_url: str, *, timeout_s: float = 10.0) -> ServerCounters:
    """Fetch and parse ``base_url``/metrics."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as response:
        return ServerCounters.parse(response.read().decode("utf-8"))
