"""How the runtime forms and runs batches, seen through the API app and the real `Runtime`.

Warm-up before ready, length buckets, the priority header and sampled batch logs: each is
checked by what the model was actually asked to compute, never by how long anything took.
The recording model is the synthetic one, loaded through the `module:factory` URI form.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve_runtime.models.base import CollateContext, PreparedInput
from fleetserve_runtime.models.synthetic import SyntheticHandler, SyntheticParams, text_digest
from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import infer_request, until
from fleetserve_runtime.testing.asgi import serve

INFER = "/v2/models/test/infer"
HOLD = "hold"
"""The instance whose forward pass waits at the recording model's gate."""


class Recording(SyntheticHandler):
    """The synthetic model, recording every batch it collates and computes.

    A forward pass holding the text `hold` waits at `gate`, so a test decides when the
    executor frees up instead of guessing how long a batch takes.
    """

    def __init__(self, name: str, version: str, max_sequence_length: int) -> None:
        params = SyntheticParams(latency_ms=0, per_item_ms=0)
        super().__init__(name, version, max_sequence_length=max_sequence_length, params=params)
        self.shapes: list[tuple[int, int]] = []
        """(rows, padded length) of each collated batch: calibration and warm-up included."""
        self.computed: list[int] = []
        """Digests of the rows of every forward pass, in the order they ran."""
        self.holding = threading.Event()
        self.gate = threading.Event()
        self._hold = text_digest(HOLD)

    def collate(self, items: Sequence[PreparedInput], ctx: CollateContext) -> Any:
        """Record the batch's shape, then collate as the synthetic model does."""
        self.shapes.append((len(items), ctx.layout.pad_to))
        return super().collate(items, ctx)

    def forward(self, batch: Any) -> Any:
        """Record the rows; wait at the gate when the batch holds `hold`."""
        seeds, _ = batch
        rows: list[int] = seeds.tolist()
        self.computed.extend(rows)
        if self._hold in rows:
            self.holding.set()
            self.gate.wait(30)
        return super().forward(batch)

    def order(self, texts: Sequence[str]) -> list[str]:
        """Which of `texts` were computed, in the order they were computed."""
        names = {text_digest(text): text for text in texts}
        return [names[digest] for digest in self.computed if digest in names]


def recording(name: str, version: str, max_sequence_length: int) -> Recording:
    """`module:factory` entry point of the recording model."""
    return Recording(name, version, max_sequence_length)


@asynccontextmanager
async def served(**overrides: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime, Recording]]:
    """The API app serving the recording model once ready, a client, and the model."""
    async with serve(f"{__name__}:recording", **overrides) as (client, runtime):
        model = (await runtime.wait_ready()).handler
        assert isinstance(model, Recording)
        try:
            yield client, runtime, model
        finally:
            model.gate.set()


def tokens(runtime: Runtime, kind: str) -> float | None:
    labels = dict(zip(("model", "version", "track"), runtime.metrics.labels("v1"), strict=True))
    return runtime.metrics.registry.get_sample_value(
        f"fleetserve_batch_tokens_{kind}_total", labels
    )


@pytest.mark.parametrize("warmup", [True, False], ids=["warmup", "no-warmup"])
async def test_ready_comes_after_one_warmup_batch_per_bucket(*, warmup: bool) -> None:
    """Before it reports ready, the runtime ran a batch at every bucket edge (unless told not to).

    With edges 16, 64 and max_sequence_length 256, each warm-up batch is as large as
    max_batch_size (8) and the 1024-token warm-up cap allow; calibration never runs these.
    """
    batching = {"buckets": "16,64", "max_batch_size": 8}
    async with served(warmup=warmup, batching=batching) as (client, _, model):
        ready = await client.get("/v2/health/ready")
        before_traffic = set(model.shapes)
    assert ready.status_code == 200
    warmed = {(8, 16), (8, 64), (4, 256)}
    assert warmed & before_traffic == (warmed if warmup else set())


async def test_requests_of_very_different_lengths_are_batched_apart() -> None:
    """Short and long requests arriving together run in separate batches, one per bucket.

    Four 4-token and four 50-token requests, all in the queue before a batch is due: a batch
    may hold eight, but no batch mixes the lengths, so none holds more than four and no
    token is padding. Neighbouring buckets may top a batch up only while it stays 90%
    efficient, which a 4- and 50-token mix never is.
    """
    batching = {
        "buckets": "8,64",
        "max_batch_size": 8,
        "max_queue_delay_ms": 200,
        "min_padding_efficiency": 0.9,
    }
    texts = [text for i in range(4) for text in (f"short {i}", f"long {i} " + "w " * 46)]
    async with served(batching=batching) as (client, runtime, _):
        responses = await asyncio.gather(
            *(client.post(INFER, json=infer_request([text])) for text in texts)
        )
    assert [r.status_code for r in responses] == [200] * 8
    assert max(int(r.headers["x-fleetserve-batch-size"]) for r in responses) <= 4
    assert tokens(runtime, "real") == 4 * 4 + 4 * 50
    assert tokens(runtime, "padded") == tokens(runtime, "real")


async def test_a_high_priority_request_is_computed_before_queued_low_ones(
    tmp_path: Path,
) -> None:
    """`X-Fleetserve-Priority: high` overtakes low-priority requests that queued before it.

    One batch holds the executor; the first low request fills its second slot and four more
    queue, then the high one arrives, with the priority token that grants it. Aging is slowed
    so that waiting cannot promote them.
    """
    token = tmp_path / "priority-token"
    token.write_text("priority-secret-0123456789")
    config: dict[str, Any] = {
        "batching": {"max_batch_size": 1, "max_queue_delay_ms": 0},
        "queue": {"priority_aging_ms": 600_000},
        "priority_token_file": token,
    }
    lows = [f"low {i}" for i in range(5)]
    async with served(**config) as (client, runtime, model):

        def post(text: str, priority: str) -> asyncio.Task[httpx.Response]:
            headers = {"x-fleetserve-priority": priority}
            if priority == "high":
                headers["authorization"] = f"Bearer {token.read_text()}"
            return asyncio.create_task(
                client.post(INFER, json=infer_request([text]), headers=headers)
            )

        held = post(HOLD, "normal")
        assert await asyncio.to_thread(model.holding.wait, 10)
        queued = [post(text, "low") for text in lows]
        await until(lambda: len(runtime.queue) == len(lows) - 1)
        high = post("high", "high")
        await until(lambda: len(runtime.queue) == len(lows))
        model.gate.set()
        responses = await asyncio.gather(held, high, *queued)
    assert [r.status_code for r in responses] == [200] * 7
    order = model.order([HOLD, "high", *lows])
    assert order[0] == HOLD
    assert order[1] in lows, "the first low request was already formed into the next batch"
    assert order[2] == "high"
    assert sorted(order[3:]) == sorted(set(lows) - {order[1]})


async def test_one_batch_in_log_batch_sample_is_logged_with_its_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With `log_batch_sample: 3`, seven batches log the 3rd and the 6th, with their detail.

    Request i has i + 1 words, i.e. i + 3 tokens, so each record names its batch.
    """
    caplog.set_level(logging.INFO, logger="fleetserve.executor")
    async with served(log_batch_sample=3, batching={"max_queue_delay_ms": 0}) as (client, _, _):
        for i in range(7):
            response = await client.post(INFER, json=infer_request([" ".join(["w"] * (i + 1))]))
            assert response.status_code == 200
    logged = [r.__dict__ for r in caplog.records if r.name == "fleetserve.executor"]
    detail = [(r["msg"], r["size"], r["pad_to"], r["real_tokens"]) for r in logged]
    assert detail == [("batch", 1, 5, 5), ("batch", 1, 8, 8)]
    assert all({"prep_ms", "compute_ms", "oom_splits"} <= r.keys() for r in logged)
