"""HTTP API in process (ASGI transport, real lifespan): protocol, errors, overload, metrics.

Model control (load, swap, unload) is in test_repository_api.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_runtime.core.liveness import Liveness
from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.server.request_body import json_media_refusal
from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import infer_request, make_config, metric_total
from fleetserve_runtime.testing.asgi import serve

# The `serve_with_admin` fixture (conftest.py).
ServeWithAdmin = Callable[
    ..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, httpx.AsyncClient, Runtime]]
]

SYNTH = "builtin://synthetic?latency_ms=0&per_item_ms=0"
JSON = {"content-type": "application/json"}


async def test_infer_v2_returns_outputs_and_stage_timings() -> None:
    """A v2 request gets one row per instance, its request id back, and Server-Timing."""
    async with serve() as (client, _):
        response = await client.post(
            "/v2/models/test/infer",
            json=infer_request(["hello world", "hi"]),
            headers={"x-request-id": "r-1"},
        )
    assert response.status_code == 200
    body = response.json()
    assert body["model_name"] == "test"
    assert body["model_version"] == "v1"
    assert body["outputs"][0]["shape"] == [2, 8]
    assert len(body["outputs"][0]["data"]) == 16
    assert response.headers["x-request-id"] == "r-1"
    assert "queue;dur=" in response.headers["server-timing"]
    assert "compute;dur=" in response.headers["server-timing"]


async def test_predict_v1() -> None:
    """The KServe v1 predict route answers with one prediction per instance."""
    async with serve() as (client, _):
        response = await client.post("/v1/models/test:predict", json={"instances": ["a b", "c"]})
    assert response.status_code == 200
    assert len(response.json()["predictions"]) == 2


async def test_health_and_metadata() -> None:
    """Live, ready, model ready, and metadata with the measured memory figures."""
    async with serve() as (client, _):
        assert (await client.get("/v2/health/live")).json() == {"live": True}
        assert (await client.get("/v2/health/ready")).status_code == 200
        assert (await client.get("/v2/models/test/ready")).status_code == 200
        assert (await client.get("/v2/models/test/versions/v9/ready")).status_code == 503
        meta = (await client.get("/v2/models/test")).json()
    assert meta["versions"] == ["v1"]
    assert meta["inputs"][0] == {"name": "text", "datatype": "BYTES", "shape": [-1]}
    assert {"bytes_per_token", "max_batch_tokens", "weights_bytes"} <= set(meta["parameters"])


async def infer_each(client: httpx.AsyncClient, texts: list[str]) -> list[httpx.Response]:
    """Each text as a v2 infer request of its own, all sent at once."""
    infer = "/v2/models/test/infer"
    return await asyncio.gather(*(client.post(infer, json=infer_request([t])) for t in texts))


def infer_body(
    data: list[object], *, parameters: dict[str, Any] | None = None, **tensor: Any
) -> bytes:
    """`infer_request(data, **parameters)` as bytes, its tensor's fields overridden by `tensor`."""
    body = infer_request(data, **(parameters or {}))
    body["inputs"][0].update(tensor)
    return orjson.dumps(body)


BAD_REQUESTS = [
    pytest.param(b"", 400, "empty", id="empty-body"),
    pytest.param(b"{not json", 400, "not valid JSON", id="malformed-json"),
    pytest.param(b'{"inputs": "\xff\xfe"}', 400, "UTF-8", id="invalid-utf8"),
    pytest.param(b"[]", 400, "body", id="not-an-object"),
    pytest.param(b"{}", 400, "inputs", id="no-inputs"),
    pytest.param(infer_body([1.0], datatype="FP32"), 400, "datatype BYTES", id="wrong-datatype"),
    pytest.param(infer_body(["a"], datatype="STRING"), 400, "datatype", id="unknown-datatype"),
    pytest.param(infer_body(["a"], shape=[3]), 400, "shape", id="shape-mismatch"),
    pytest.param(infer_body(["a"], name="img"), 400, "input name", id="wrong-input-name"),
    pytest.param(infer_body([""]), 400, "non-empty", id="empty-string"),
    pytest.param(infer_body([5]), 400, "string", id="not-a-string"),
    pytest.param(
        infer_body(["a"], parameters={"timeout_ms": 999999}),
        403, "parameters.timeout_ms 999999 is above the default", id="timeout-over-default",
    ),
    pytest.param(
        infer_body(["a"], parameters={"priority": "urgent"}), 400, "priority", id="bad-priority"
    ),
    pytest.param(infer_body(list("abcde")), 413, "limit is 4", id="too-many-instances"),
    pytest.param(infer_body(["w " * 40]), 413, "max_sequence_length 32", id="input-too-long"),
    pytest.param(b'{"x":"' + b"a" * 5000 + b'"}', 413, "exceeds the limit", id="body-too-large"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "message"), BAD_REQUESTS)
async def test_bad_input_gets_a_4xx_json_error(body: bytes, status: int, message: str) -> None:
    """Each kind of bad input gets its 4xx and a JSON error naming the problem; never a 500."""
    async with serve(
        max_instances=4, max_body_bytes=4096, batching={"max_sequence_length": 32}
    ) as (client, _):
        response = await client.post("/v2/models/test/infer", content=body, headers=JSON)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("POST", "/v2/models/other/infer", 404, id="unknown-model"),
        pytest.param("GET", "/v2/nothing-here", 404, id="unknown-route"),
        pytest.param("GET", "/v2/models/test/infer", 405, id="wrong-method"),
        pytest.param("POST", "/v2/models/test/versions/v7/infer", 404, id="unknown-version"),
    ],
)
async def test_routing_errors_are_json(method: str, path: str, status: int) -> None:
    """Unknown models, routes and methods answer with the JSON error shape too."""
    async with serve() as (client, _):
        response = await client.request(method, path, json=infer_request(["a"]))
    assert response.status_code == status
    assert "error" in response.json()


async def test_v1_bad_input() -> None:
    """v1 validates too: no instances is a 400."""
    async with serve() as (client, _):
        response = await client.post("/v1/models/test:predict", json={"instances": []})
    assert response.status_code == 400
    assert "instances" in response.json()["error"]


async def test_huge_text_is_refused_before_tokenising() -> None:
    """A text far longer than any allowed token count gets 413 at once (or is cut if asked)."""
    huge = "word " * 100_000
    async with serve(batching={"max_sequence_length": 16}) as (client, _):
        refused = await client.post("/v2/models/test/infer", json=infer_request([huge]))
        cut = await client.post("/v2/models/test/infer", json=infer_request([huge], truncate=True))
    assert refused.status_code == 413
    assert "characters" in refused.json()["error"]
    assert cut.status_code == 200


async def test_deeply_nested_data_is_a_400() -> None:
    """Data nested far deeper than the tensor's shape is refused, never a recursion error."""
    nested = "[" * 900 + '"a"' + "]" * 900
    body = '{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":' + nested + "}]}"
    async with serve() as (client, _):
        response = await client.post("/v2/models/test/infer", content=body.encode(), headers=JSON)
    assert response.status_code == 400
    assert "nested deeper" in response.json()["error"]


async def test_unknown_versions_share_one_metrics_label() -> None:
    """Requests naming versions that are not loaded cannot mint new metric series."""
    async with serve() as (client, _):
        for i in range(3):
            await client.post(f"/v2/models/test/versions/junk{i}/infer", json=infer_request(["x"]))
        text = (await client.get("/metrics")).text
    assert metric_total(text, "fleetserve_requests_total", version="unknown", code="404") == 3
    assert "junk" not in text


async def test_truncation_only_when_asked() -> None:
    """An over-long input is refused, unless the request asks to truncate it."""
    long_text = "w " * 40
    async with serve(batching={"max_sequence_length": 16}) as (client, _):
        refused = await client.post("/v2/models/test/infer", json=infer_request([long_text]))
        accepted = await client.post(
            "/v2/models/test/infer", json=infer_request([long_text], truncate=True)
        )
    assert refused.status_code == 413
    assert accepted.status_code == 200


async def test_full_queue_answers_503_with_retry_after() -> None:
    """Overload is refused with 503 and Retry-After, and the server keeps serving."""
    slow = "builtin://synthetic?latency_ms=300&per_item_ms=0"
    async with serve(
        model=slow, max_instances=1, queue={"max_queue_size": 1}, batching={"max_batch_size": 1}
    ) as (client, _):
        responses = await infer_each(client, [f"t{i}" for i in range(8)])
        codes = sorted(r.status_code for r in responses)
        rejected = [r for r in responses if r.status_code == 503]
        after = await client.post("/v2/models/test/infer", json=infer_request(["later"]))
    assert 200 in codes
    assert rejected
    assert rejected[0].headers["retry-after"] == "1"
    assert "queue is full" in rejected[0].json()["error"]
    assert after.status_code == 200


async def test_deadline_in_queue_answers_504_before_the_batch_ahead_ends() -> None:
    """A request whose deadline passes while queued gets 504 without waiting for a batch.

    Both executor slots hold a 400 ms batch; the 504 for a 60 ms deadline comes while the
    first is still computing (no batch finished yet), and the request is never computed.
    """
    slow = "builtin://synthetic?latency_ms=400&per_item_ms=0"
    async with serve(model=slow, batching={"max_batch_size": 1}) as (client, runtime):
        blockers = [
            asyncio.create_task(client.post("/v2/models/test/infer", json=infer_request([f"b{i}"])))
            for i in range(2)
        ]
        async with asyncio.timeout(10):
            while runtime.snapshot().inflight_requests < len(blockers) or len(runtime.queue):
                await asyncio.sleep(0.005)
        late = await client.post(
            "/v2/models/test/infer",
            json=infer_request(["late"]),
            headers={"x-fleetserve-timeout-ms": "60"},
        )
        at_the_504 = (await client.get("/metrics")).text
        await asyncio.gather(*blockers)
        metrics = (await client.get("/metrics")).text
    assert late.status_code == 504
    assert "deadline" in late.json()["error"]
    assert metric_total(at_the_504, "fleetserve_batch_size_count") == 0
    assert metric_total(metrics, "fleetserve_batch_size_count") == 2
    assert metric_total(metrics, "fleetserve_requests_total", code="504") == 1


async def test_failing_batch_fails_only_its_requests() -> None:
    """A batch that raises answers 500 with an error id; other batches and later requests work."""
    model = "fleetserve_runtime.testing:exploding_handler"
    async with serve(model=model) as (client, _):
        boom = await client.post("/v2/models/test/infer", json=infer_request(["boom"]))
        fine = await client.post("/v2/models/test/infer", json=infer_request(["fine"]))
        metrics = (await client.get("/metrics")).text
    assert boom.status_code == 500
    assert boom.json()["error_id"] in boom.json()["error"]
    assert fine.status_code == 200
    assert metric_total(metrics, "fleetserve_batch_failures_total") == 1


async def test_item_errors_fail_only_that_request() -> None:
    """With error_rate=1 every request fails with 500; the server stays up."""
    async with serve(model="builtin://synthetic?error_rate=1&latency_ms=0") as (client, _):
        response = await client.post("/v2/models/test/infer", json=infer_request(["a"]))
        live = await client.get("/v2/health/live")
    assert response.status_code == 500
    assert "synthetic failure" in response.json()["error"]
    assert live.status_code == 200


async def test_oom_splits_the_batch_and_retries() -> None:
    """A batch over the memory limit is halved until it fits; only a lone misfit gets 503."""
    model = "builtin://synthetic?latency_ms=20&oom_above_tokens=12"
    async with serve(model=model, batching={"max_batch_size": 8}) as (client, _):
        small = await infer_each(client, [f"a b c{i}" for i in range(6)])
        huge = await client.post("/v2/models/test/infer", json=infer_request(["w " * 20]))
        metrics = (await client.get("/metrics")).text
    assert [r.status_code for r in small] == [200] * 6
    assert metric_total(metrics, "fleetserve_oom_splits_total") >= 1
    assert huge.status_code == 503
    assert "does not fit in memory" in huge.json()["error"]


async def test_concurrent_requests_are_batched() -> None:
    """Concurrent requests share forward passes: fewer batches than requests."""
    model = "builtin://synthetic?latency_ms=30&per_item_ms=0"
    async with serve(model=model, batching={"max_batch_size": 16}) as (client, _):
        responses = await infer_each(client, [f"t {i}" for i in range(32)])
        metrics = (await client.get("/metrics")).text
    assert all(r.status_code == 200 for r in responses)
    batches = metric_total(metrics, "fleetserve_batch_size_count")
    assert metric_total(metrics, "fleetserve_batch_size_sum") == 32
    assert batches <= 8


@pytest.mark.parametrize("value", [b"abc", b"1_000", b"+5", b"5 ", b"1e3", b"\xb3", b"9" * 40])
async def test_a_bad_timeout_header_is_a_400_naming_it(value: bytes) -> None:
    """X-Fleetserve-Timeout-Ms takes decimal digits only; the error names the header."""
    async with serve() as (client, _):
        response = await client.post(
            "/v2/models/test/infer",
            json=infer_request(["x"]),
            headers={"x-fleetserve-timeout-ms": value},
        )
    assert response.status_code == 400
    assert response.json()["error"].startswith(
        "x-fleetserve-timeout-ms must be a whole number of milliseconds"
    )


async def test_memory_budget_derives_a_token_limit() -> None:
    """With a budget, the measured profile yields a batch token limit in the metadata."""
    async with serve(memory={"budget_bytes": 1 << 30}) as (client, _):
        meta = (await client.get("/v2/models/test")).json()["parameters"]
    assert meta["max_batch_tokens"] > 0
    assert meta["memory_budget_bytes"] == 1 << 30


async def test_budget_too_small_fails_readiness_with_reason() -> None:
    """A budget that cannot hold one request keeps the server unready and says why."""
    app = create_app(make_config(memory={"budget_bytes": 1024, "reserve_fraction": 0.5}))
    async with LifespanManager(app, startup_timeout=60) as manager:
        with pytest.raises(ValueError, match="cannot hold one request"):
            await app.state.runtime.wait_ready()
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rt") as client:
            ready = await client.get("/v2/health/ready")
            infer = await client.post("/v2/models/test/infer", json=infer_request(["x"]))
    assert ready.status_code == 503
    assert "cannot hold one request" in ready.json()["error"]
    assert infer.status_code == 503


async def test_metrics_exposes_the_documented_names() -> None:
    """Every documented metric family is present, with model/version/track labels."""
    async with serve() as (client, _):
        await client.post("/v2/models/test/infer", json=infer_request(["x"]))
        text = (await client.get("/metrics")).text
    names = {family.name for family in text_string_to_metric_families(text)}
    expected = {
        "fleetserve_requests",
        "fleetserve_request_duration_seconds",
        "fleetserve_queue_wait_seconds",
        "fleetserve_batch_size",
        "fleetserve_padding_efficiency_ratio",
        "fleetserve_batch_tokens_real",
        "fleetserve_batch_tokens_padded",
        "fleetserve_queue_depth_requests",
        "fleetserve_inflight_requests",
        "fleetserve_cache_hits",
        "fleetserve_cache_misses",
        "fleetserve_model_load_seconds",
        "fleetserve_memory_allocated_bytes",
        "fleetserve_memory_reserved_bytes",
        "fleetserve_buffer_pool_hits",
        "fleetserve_model_bytes_per_token",
        "fleetserve_model_max_batch_tokens",
        "fleetserve_batch_compute_seconds",
        "fleetserve_oom_splits",
    }
    assert expected <= names
    assert (
        metric_total(text, "fleetserve_requests_total", model="test", version="v1", track="stable")
        == 1
    )


async def test_liveness_failure_is_503_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the runtime says it is not alive, /v2/health/live says 503 and why."""
    async with serve() as (client, runtime):
        monkeypatch.setattr(runtime, "liveness", lambda: Liveness(False, "executor stuck"))
        response = await client.get("/v2/health/live")
    assert response.status_code == 503
    assert response.json() == {"live": False, "reason": "executor stuck"}


async def test_live_while_starting() -> None:
    """Before the lifespan has created the runtime, the process counts as alive."""
    transport = httpx.ASGITransport(app=create_app(make_config()))
    async with httpx.AsyncClient(transport=transport, base_url="http://rt") as client:
        response = await client.get("/v2/health/live")
    assert (response.status_code, response.json()) == (200, {"live": True})


async def test_unexpected_errors_are_json_500_without_details(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug outside inference answers a JSON 500 with an error id; the details stay in the log."""

    def broken(model: object) -> dict[str, object]:
        raise RuntimeError("secret detail in /srv/internal/module.py")

    async with serve() as (client, runtime):
        monkeypatch.setattr(runtime, "describe", broken)
        response = await client.get("/v2/models/test", headers={"x-request-id": "r-500"})
    assert response.status_code == 500
    body = response.json()
    assert body["request_id"] == "r-500"
    assert "error id" in body["error"]
    assert "secret" not in response.text
    assert "/srv" not in response.text


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        pytest.param("req-7", True, id="kept"),
        pytest.param("x" * 500, False, id="too-long"),
        pytest.param("two words", False, id="space"),
    ],
)
async def test_every_response_carries_its_request_id(sent: str, *, kept: bool) -> None:
    """X-Request-ID comes back on every response; an unusable one is replaced by a fresh id."""
    async with serve() as (client, _):
        responses = [
            await client.get("/v2/health/live", headers={"x-request-id": sent}),
            await client.get("/v2/nowhere", headers={"x-request-id": sent}),
        ]
    for response in responses:
        returned = response.headers["x-request-id"]
        assert (returned == sent) is kept
        assert returned
    assert responses[1].json()["request_id"] == responses[1].headers["x-request-id"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param({"instances": [[["a"]]]}, 400, "max_tensor_rank", id="v1-too-deep"),
        pytest.param(
            {"instances": [["a", "b", "c"]] * 2}, 413, "max_tensor_elements", id="v1-values"
        ),
    ],
)
async def test_v1_instances_are_bounded(body: dict[str, Any], status: int, message: str) -> None:
    """KServe v1 instances obey the same nesting and value limits as tensors."""
    async with serve(max_tensor_rank=2, max_tensor_elements=4, max_instances=4) as (client, _):
        response = await client.post("/v1/models/test:predict", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]


@pytest.mark.parametrize(
    ("content_type", "binary", "refused"),
    [
        pytest.param("application/json", False, None, id="json"),
        pytest.param("Application/JSON; charset=UTF-8", False, None, id="json-utf8"),
        pytest.param(None, False, "got 'none'", id="missing"),
        pytest.param("application/x-www-form-urlencoded", False, "application/json", id="form"),
        pytest.param("application/json; charset=utf-16", False, "UTF-8", id="utf16"),
        pytest.param("application/json", True, "Inference-Header-Content-Length", id="binary"),
    ],
)
def test_json_media_refusal(content_type: str | None, binary: bool, refused: str | None) -> None:
    """Only UTF-8 application/json passes; the binary tensor extension is refused by name."""
    reason = json_media_refusal(content_type, binary_extension=binary)
    assert (reason is None) == (refused is None)
    if refused is not None:
        assert refused in str(reason)


@pytest.mark.parametrize(
    ("content_type", "refused"),
    [
        pytest.param(None, False, id="missing"),
        pytest.param("application/json", False, id="json"),
        pytest.param("", True, id="empty"),
        pytest.param("text/plain", True, id="text"),
        pytest.param("text/plain; charset=utf-8", True, id="text-utf8"),
        pytest.param("application/x-www-form-urlencoded", True, id="form"),
        pytest.param("multipart/form-data; boundary=x", True, id="multipart"),
    ],
)
def test_missing_media_type_is_json_on_the_inference_routes(
    content_type: str | None, refused: bool
) -> None:
    """Where a missing type counts as JSON, what a browser sends without preflight does not."""
    reason = json_media_refusal(content_type, binary_extension=False, missing_is_json=True)
    assert (reason is not None) == refused


async def test_inference_routes_take_a_body_without_content_type() -> None:
    """A JSON body without `Content-Type` is served on v2 infer and v1 predict, as by Triton.

    A form or text/plain post is still 415.
    """
    async with serve(model=SYNTH) as (client, _):
        for path in ["/v2/models/test/infer", "/v2/models/test/versions/v1/infer"]:
            served = await client.post(path, content=orjson.dumps(infer_request(["a", "b"])))
            assert served.status_code == 200, served.text
            assert served.json()["outputs"][0]["shape"][0] == 2
            for media in ["text/plain", "application/x-www-form-urlencoded"]:
                refused = await client.post(
                    path,
                    content=orjson.dumps(infer_request(["a"])),
                    headers={"content-type": media},
                )
                assert refused.status_code == 415, media
        predicted = await client.post(
            "/v1/models/test:predict", content=orjson.dumps({"instances": ["a"]})
        )
        assert predicted.status_code == 200, predicted.text
        assert len(predicted.json()["predictions"]) == 1
