"""The series a canary analysis reads exist at 0 from the moment a version is loaded.

Prometheus's `increase()` counts nothing before a series' first sample: a `code="500"`
series born at 1 would hide the canary's first error. These read a started runtime's
real `/metrics` over HTTP before it has answered any request.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from fleetserve_runtime.core.metrics import ANSWERED_CODES, LATENCY_BUCKETS_S
from fleetserve_runtime.server.http_errors import STATUS_OF
from fleetserve_runtime.testing.asgi import serve

SYNTH = "builtin://synthetic?latency_ms=0&per_item_ms=0"


def _samples(text: str, name: str, version: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of `name` for `version`, keyed by their other labels."""
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("version") == version:
                rest = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "version"))
                found[rest] = sample.value
    return found


async def test_a_loaded_version_exposes_every_analysed_series_at_zero() -> None:
    """Before any request: a 0 count per answered status code, 0-count latency histograms."""
    async with serve(SYNTH) as (client, runtime):
        text = (await client.get("/metrics")).text
        version = runtime.active_version
    assert version is not None
    codes = {dict(labels)["code"]: value for labels, value in
             _samples(text, "fleetserve_requests_total", version).items()}  # fmt: skip
    assert codes == {str(code): 0.0 for code in ANSWERED_CODES}
    for histogram in ("fleetserve_request_duration_seconds", "fleetserve_queue_wait_seconds"):
        buckets = _samples(text, f"{histogram}_bucket", version)
        assert len(buckets) == len(LATENCY_BUCKETS_S) + 1, histogram
        assert set(buckets.values()) == {0.0}
        assert set(_samples(text, f"{histogram}_count", version).values()) == {0.0}


async def test_the_first_error_moves_an_existing_series() -> None:
    """An error after the first scrape increments the 500 series that scrape already saw."""
    async with serve(SYNTH) as (client, runtime):
        version = runtime.active_version
        assert version is not None
        before = (await client.get("/metrics")).text
        runtime.metrics.observe_request(version, 500, 0.01)
        after = (await client.get("/metrics")).text

    def errors(text: str) -> list[float]:
        samples = _samples(text, "fleetserve_requests_total", version).items()
        return [value for labels, value in samples if dict(labels)["code"] == "500"]

    assert (errors(before), errors(after)) == ([0.0], [1.0])


def test_every_status_the_runtime_answers_is_declared() -> None:
    """The declared codes cover the error table, so no answered code is born at 1."""
    assert {200, *STATUS_OF.values()} <= set(ANSWERED_CODES)
