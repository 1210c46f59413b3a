"""A generative version's KV pool as scrape-time gauges, for the operator's memory check.

The operator may not import the runtime and reads the pool's size from Prometheus:
`fleetserve_model_kv_cache_blocks` and `fleetserve_model_kv_cache_block_bytes` must be the
figures the runtime sized its pool with (those `Runtime.describe` gives `/v2/models/{name}`),
per version.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from fleetserve_runtime.testing.asgi import serve

LLM = "builtin://synthetic-generate?per_token_ms=0&output_tokens=4&context_length=256"
KV_GAUGES = ("fleetserve_model_kv_cache_blocks", "fleetserve_model_kv_cache_block_bytes")


def samples(text: str, name: str) -> dict[tuple[str, str, str], float]:
    found: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                labels = sample.labels
                found[labels["model"], labels["version"], labels["track"]] = sample.value
    return found


async def test_kv_gauges_are_the_pool_the_runtime_sized() -> None:
    """Blocks and block bytes equal the metadata's `kv_cache`, labelled by version."""
    budget = {"budget_bytes": 64 * 2**20, "reserve_fraction": 0.1}
    async with serve(LLM, memory=budget, generation={"block_size": 8}) as (client, runtime):
        kv = runtime.describe(runtime.registry.active)["kv_cache"]
        text = (await client.get("/metrics")).text
    key = ("test", "v1", "stable")
    assert kv["block_size"] == 8
    assert samples(text, "fleetserve_model_kv_cache_blocks") == {key: kv["num_blocks"]}
    assert samples(text, "fleetserve_model_kv_cache_block_bytes") == {key: kv["block_bytes"]}
    assert kv["num_blocks"] * kv["block_bytes"] == kv["pool_bytes"] > 0


async def test_an_encoder_exports_no_kv_series() -> None:
    """An encoder has no KV pool: the families exist, without a sample."""
    async with serve("builtin://synthetic?latency_ms=0&per_item_ms=0") as (client, _):
        text = (await client.get("/metrics")).text
    for name in KV_GAUGES:
        assert samples(text, name) == {}
