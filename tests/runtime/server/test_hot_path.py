"""The per-request path does no avoidable work, and keeps every behaviour.

No system call per request id, no metric label lookup per answer, no task per scheduler
wake-up, a hook to freeze the heap once the model is loaded; the infer routes, served past
FastAPI's router, keep auth, request ids and errors.

These are the fixes the zero-cost HTTP profile asked for (`bench.http_overhead_bench`);
each test fails on the code before its fix. No timings are asserted.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from asgi_lifespan import LifespanManager

from fleetserve_runtime.core.logs import request_id_from
from fleetserve_runtime.core.metrics import RuntimeMetrics, StateSnapshot
from fleetserve_runtime.server.app import create_apps
from fleetserve_runtime.serving.runtime import InferenceCall, Runtime
from fleetserve_runtime.testing import make_config
from fleetserve_runtime.testing.asgi import serve

SYNTH = "builtin://synthetic?latency_ms=0&per_item_ms=0"
BODY = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi there"]}]}


def _snapshot() -> StateSnapshot:
    return StateSnapshot(0, 0, 0, 0, 0, 0, {})


def test_request_ids_need_no_system_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh ids are 32 hex digits, distinct, and drawn without `os.urandom` (a syscall)."""

    def no_syscall(size: int) -> bytes:
        raise AssertionError("os.urandom called on the request path")

    monkeypatch.setattr(os, "urandom", no_syscall)
    ids = {request_id_from(None) for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def _count_calls(monkeypatch: pytest.MonkeyPatch, metric: Any) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []
    original = metric.labels

    def counting(*values: str) -> Any:
        calls.append(values)
        return original(*values)

    monkeypatch.setattr(metric, "labels", counting)
    return calls


def test_answers_reuse_their_labelled_series(monkeypatch: pytest.MonkeyPatch) -> None:
    """`labels()` (a lock and validation) runs once per version and code, not per answer."""
    metrics = RuntimeMetrics(model="m", track="stable", snapshot=_snapshot)
    calls = _count_calls(monkeypatch, metrics.requests)
    for _ in range(5):
        metrics.observe_request("v1", 200, 0.01)
    metrics.observe_request("v1", 503, 0.01)
    assert calls == [("m", "v1", "stable", "200"), ("m", "v1", "stable", "503")]
    labels = {"model": "m", "version": "v1", "track": "stable", "code": "200"}
    assert metrics.registry.get_sample_value("fleetserve_requests_total", labels) == 5


def test_batches_reuse_their_labelled_series(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version's batch series are looked up once; every batch is still counted."""
    metrics = RuntimeMetrics(model="m", track="stable", snapshot=_snapshot)
    calls = _count_calls(monkeypatch, metrics.batch_size)
    for _ in range(3):
        metrics.observe_batch(
            "v1", size=4, real_tokens=10, padded_tokens=12, queue_waits=[0.001], compute_s=0.002
        )
    assert calls == [("m", "v1", "stable")]
    labels = {"model": "m", "version": "v1", "track": "stable"}
    assert metrics.registry.get_sample_value("fleetserve_batch_size_count", labels) == 3
    assert metrics.registry.get_sample_value("fleetserve_queue_wait_seconds_count", labels) == 3


async def test_the_scheduler_creates_no_task_per_wake_up() -> None:
    """Sequential requests wake the scheduler each time; none of those wakes starts a task."""
    loop = asyncio.get_running_loop()
    created: list[str] = []
    factory = loop.get_task_factory()

    def counting(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", "?"))
        if factory is not None:
            return factory(loop, coro, **kwargs)  # type: ignore[return-value]
        return asyncio.Task(coro, loop=loop, **kwargs)

    runtime = Runtime(make_config(model=SYNTH, batching={"max_queue_delay_ms": 1}))
    await runtime.start()
    try:
        await runtime.wait_ready()
        loop.set_task_factory(counting)
        for n in range(30):
            await runtime.infer(InferenceCall(instances=[f"text {n}"]))
    finally:
        loop.set_task_factory(factory)
        await runtime.stop()
    assert created == []


TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    return path


async def test_infer_routes_keep_auth_ids_and_errors(token_file: Path) -> None:
    """The infer paths, served past FastAPI's router, answer exactly as routes do."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with serve(SYNTH, name="m", auth_token_file=token_file) as (client, _):
        refused = await client.post("/v2/models/m/infer", json=BODY)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["request_id"] == refused.headers["x-request-id"]

        answered = await client.post(
            "/v2/models/m/versions/v1/infer", json=BODY, headers={**auth, "x-request-id": "r-1"}
        )
        assert answered.status_code == 200, answered.text
        assert answered.headers["x-request-id"] == "r-1"
        assert answered.json()["outputs"][0]["shape"] == [1, 8]
        assert "server-timing" in answered.headers

        unknown = await client.post("/v2/models/other/infer", json=BODY, headers=auth)
        assert unknown.status_code == 404
        assert set(unknown.json()) == {"error", "request_id"}

        missing = await client.post("/v2/models/m/versions/v9/infer", json=BODY, headers=auth)
        assert missing.status_code == 404

        # Not an infer path: FastAPI's router answers, as before.
        wrong_method = await client.get("/v2/models/m/infer", headers=auth)
        assert wrong_method.status_code == 405


async def test_on_ready_runs_once_after_the_first_load() -> None:
    """The CLI freezes the heap from this hook: after the load, once; never on a failure."""
    calls: list[str] = []
    apps = create_apps(make_config(model=SYNTH), on_ready=lambda: calls.append("ready"))
    async with LifespanManager(apps.inference, startup_timeout=60, shutdown_timeout=30):
        await apps.inference.state.runtime.wait_ready()
        for _ in range(100):
            if calls:
                break
            await asyncio.sleep(0.01)
    assert calls == ["ready"]

    failures: list[BaseException] = []
    broken = create_apps(
        make_config(model="builtin://no-such-model"),
        on_load_failure=failures.append,
        on_ready=lambda: calls.append("ready"),
    )
    async with LifespanManager(broken.inference, startup_timeout=60, shutdown_timeout=30):
        for _ in range(200):
            if failures:
                break
            await asyncio.sleep(0.01)
    assert len(failures) == 1
    assert calls == ["ready"]
