"""While the executor is stuck on one batch: deadlines still hold and liveness fails, then heals.

The synthetic model's `stall_ms` (`collate_stall_ms`) wedges exactly one batch's compute
(prepare) step, the batch holding `stall`, so calibration and every other batch stay fast.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx

from fleetserve_runtime.core.errors import DeadlineExceeded
from fleetserve_runtime.core.liveness import Liveness
from fleetserve_runtime.models.synthetic import STALL_TEXT
from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.serving.runtime import InferenceCall, Runtime
from fleetserve_runtime.testing import infer_request, make_config, metric_total
from tests.runtime.uvicorn_thread import uvicorn_thread

STALL_S = 4.0
"""How long the stuck batch runs: long against the deadlines below, short for a test."""
DEADLINE_MS = 1000
MARGIN_S = 0.5
"""Slack past a deadline for the scheduler's wake-up on a loaded 2-core CI machine."""
STUCK_MODEL = f"builtin://synthetic?latency_ms=0&per_item_ms=0&stall_ms={STALL_S * 1000:g}"
STUCK_COLLATE_MODEL = (
    f"builtin://synthetic?latency_ms=0&per_item_ms=0&collate_stall_ms={STALL_S * 1000:g}"
)
FLOOR_S = 0.5
"""A stuck-batch floor far below the stall, so liveness fails while it runs."""


@asynccontextmanager
async def started(model: str = STUCK_MODEL, **overrides: Any) -> AsyncIterator[Runtime]:
    runtime = Runtime(make_config(model=model, **overrides))
    await runtime.start()
    try:
        await runtime.wait_ready()
        yield runtime
    finally:
        await runtime.stop()


async def timed(runtime: Runtime, text: str, timeout_ms: int) -> tuple[str, float]:
    """Outcome ("ok" or "DeadlineExceeded") and seconds to it."""
    began = time.monotonic()
    try:
        await runtime.infer(InferenceCall([text], timeout_ms=timeout_ms))
    except DeadlineExceeded:
        return "DeadlineExceeded", time.monotonic() - began
    return "ok", time.monotonic() - began


def computed(runtime: Runtime) -> float | None:
    """Instances computed so far (the batch-size histogram's sum)."""
    labels = dict(zip(("model", "version", "track"), runtime.metrics.labels("v1"), strict=True))
    return runtime.metrics.registry.get_sample_value("fleetserve_batch_size_sum", labels)


async def test_a_request_behind_a_stuck_batch_gets_504_at_its_deadline() -> None:
    """The next batch waits behind the running one; its requests still expire on time.

    With one batch running, the executor has room for one more: the late request is formed
    into that batch at once, out of the queue, and used to wait for the stuck batch to end.
    """
    async with started(batching={"max_batch_size": 1}) as runtime:
        stuck = asyncio.create_task(timed(runtime, STALL_TEXT, 30_000))
        await asyncio.sleep(0.2)
        outcome, waited = await timed(runtime, "late", DEADLINE_MS)
        assert (outcome, (await stuck)[0]) == ("DeadlineExceeded", "ok")
    assert DEADLINE_MS / 1000 <= waited < DEADLINE_MS / 1000 + MARGIN_S


async def test_expired_requests_are_never_computed_after_the_stuck_batch() -> None:
    """Requests answered 504 behind a stuck batch cost no compute once it ends."""
    async with started(batching={"max_batch_size": 2, "max_queue_delay_ms": 0}) as runtime:
        stuck = asyncio.create_task(timed(runtime, STALL_TEXT, 30_000))
        await asyncio.sleep(0.2)
        late = await asyncio.gather(*(timed(runtime, f"late {i}", DEADLINE_MS) for i in range(5)))
        assert [outcome for outcome, _ in late] == ["DeadlineExceeded"] * 5
        await stuck
        assert (await timed(runtime, "after", 5_000))[0] == "ok"
        assert computed(runtime) == 2, "only the stuck request and the one after it ran"


async def test_a_caller_that_goes_away_leaves_no_work_behind_the_stuck_batch() -> None:
    """A cancelled request waiting in the next batch is taken out of it."""
    async with started(batching={"max_batch_size": 1}) as runtime:
        stuck = asyncio.create_task(timed(runtime, STALL_TEXT, 30_000))
        await asyncio.sleep(0.2)
        gone = asyncio.create_task(timed(runtime, "gone", 30_000))
        await asyncio.sleep(0.2)
        gone.cancel()
        await stuck
        assert (await timed(runtime, "after", 5_000))[0] == "ok"
        assert computed(runtime) == 2, "only the stuck request and the one after it ran"


async def test_liveness_fails_while_a_batch_is_stuck_and_recovers_after() -> None:
    """Past max(floor, factor x measured pace), liveness fails naming the batch; then heals."""
    health = {"stuck_batch_floor_s": FLOOR_S, "stuck_batch_factor": 10}
    async with started(health=health) as runtime:
        for i in range(3):
            assert (await timed(runtime, f"pace {i}", 5_000))[0] == "ok"
        assert runtime.liveness() == Liveness(ok=True)
        began = time.monotonic()
        stuck = asyncio.create_task(timed(runtime, STALL_TEXT, 30_000))
        verdicts: list[tuple[float, Liveness]] = []
        while not stuck.done():
            verdicts.append((time.monotonic() - began, runtime.liveness()))
            await asyncio.sleep(0.05)
        assert (await stuck)[0] == "ok"
        after = runtime.liveness()
    failed = [(at, verdict) for at, verdict in verdicts if not verdict.ok]
    assert failed, "liveness never failed while the batch was stuck"
    first_failed_at, verdict = failed[0]
    # It failed while the batch ran (verdicts stop when it ends); only the floor bounds when.
    assert first_failed_at >= FLOOR_S
    assert verdict.reason.startswith("executor stuck: batch running for")
    assert all(not v.ok for at, v in verdicts if at > first_failed_at), "it stays failed"
    assert after == Liveness(ok=True)


async def test_a_stuck_collate_fails_liveness_and_sets_the_stalled_gauge() -> None:
    """A batch hung in `collate` (the prepare thread) wedges the executor too: liveness fails."""
    health = {"stuck_batch_floor_s": FLOOR_S}
    async with started(STUCK_COLLATE_MODEL, health=health) as runtime:
        stuck = asyncio.create_task(timed(runtime, STALL_TEXT, 30_000))
        seen: list[tuple[Liveness, bool]] = []
        while not stuck.done():
            seen.append((runtime.liveness(), runtime.snapshot().executor_stalled))
            await asyncio.sleep(0.05)
        assert (await stuck)[0] == "ok"
        after = (runtime.liveness(), runtime.snapshot().executor_stalled)
    failed = [(verdict, stalled) for verdict, stalled in seen if not verdict.ok]
    assert failed, "liveness never failed while collate was stuck"
    assert failed[-1][0].reason.startswith("executor stuck: batch running for")
    assert all(stalled for _, stalled in failed)
    assert after == (Liveness(ok=True), False)


async def test_a_stalled_event_loop_fails_liveness_during_and_just_after_the_stall() -> None:
    """Seen from a thread during the stall, and on the loop for as long again after it."""
    stall_s, limit_s = 0.8, 0.2
    async with started(health={"loop_stall_s": limit_s}) as runtime:
        await asyncio.sleep(0.2)
        assert runtime.liveness().ok
        during: list[Liveness] = []
        probe = threading.Timer(stall_s / 2, lambda: during.append(runtime.liveness()))
        probe.start()
        time.sleep(stall_s)  # blocks the event loop, as a runaway callback would
        probe.join()
        await asyncio.sleep(0.05)
        just_after = runtime.liveness()
        healed_in: float | None = None
        began = time.monotonic()
        while time.monotonic() - began < 5:
            if runtime.liveness().ok:
                healed_in = time.monotonic() - began
                break
            await asyncio.sleep(0.05)
    assert not during[0].ok
    assert during[0].reason.startswith("event loop stalled for")
    assert not just_after.ok
    assert healed_in is not None, "liveness did not recover after the stall"


@contextmanager
def real_server(**overrides: Any) -> Iterator[str]:
    """The app under uvicorn on a free loopback port, in a thread; yields its URL once ready."""
    with uvicorn_thread(create_app(make_config(model=STUCK_MODEL, **overrides))) as port:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/v2/health/ready", timeout=30).status_code == 200
        yield url


def stalled_gauge(metrics: str) -> float:
    return metric_total(metrics, "fleetserve_executor_stalled")


def test_over_http_a_stuck_batch_fails_live_and_504s_arrive_on_time() -> None:
    """Over loopback, behind a 4 s batch: 504 after about 1 s; /live 503 and the gauge set.

    `/v2/health/live` answers 503 with the reason and `fleetserve_executor_stalled` is 1 while
    the batch is past its limit; both clear once it ends.
    """

    async def scenario(url: str) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            stuck = asyncio.create_task(
                client.post("/v2/models/test/infer", json=infer_request([STALL_TEXT]))
            )
            await asyncio.sleep(0.3)
            began = time.monotonic()
            late = await client.post(
                "/v2/models/test/infer",
                json=infer_request(["late"]),
                headers={"x-fleetserve-timeout-ms": str(DEADLINE_MS)},
            )
            seen: dict[str, Any] = {"late": late.status_code, "waited": time.monotonic() - began}
            seen["live during"] = await client.get("/v2/health/live")
            seen["gauge during"] = stalled_gauge((await client.get("/metrics")).text)
            seen["stuck"] = (await stuck).status_code
            seen["live after"] = (await client.get("/v2/health/live")).status_code
            seen["gauge after"] = stalled_gauge((await client.get("/metrics")).text)
            return seen

    with real_server(health={"stuck_batch_floor_s": FLOOR_S}) as url:
        seen = asyncio.run(scenario(url))
    assert (seen["late"], seen["stuck"]) == (504, 200)
    assert DEADLINE_MS / 1000 <= seen["waited"] < DEADLINE_MS / 1000 + MARGIN_S
    assert seen["live during"].status_code == 503
    assert seen["live during"].json()["live"] is False
    assert seen["live during"].json()["reason"].startswith("executor stuck: batch running for")
    assert (seen["gauge during"], seen["live after"], seen["gauge after"]) == (1, 200, 0)
