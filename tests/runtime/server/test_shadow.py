"""The shadow mirror's parts without a network: sampling, the bound on copies, comparisons."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from fleetserve_runtime.core.config_sections import ShadowConfig
from fleetserve_runtime.core.metrics import ShadowMetrics
from fleetserve_runtime.core.shadow_target import ShadowTarget
from fleetserve_runtime.server.shadow import Copy, Kind, Shadow, compare, kind_of
from fleetserve_runtime.testing import make_config

URL = "http://next.ns.svc:8080"
TARGET = ShadowTarget(url=URL)


def _shadow(
    handler: Any, *, draw: float = 0.0, **settings: Any
) -> tuple[Shadow, CollectorRegistry]:
    config = ShadowConfig(url=URL, **settings)
    shadow = Shadow(config, draw=lambda: draw, transport=httpx2.MockTransport(handler))
    registry = CollectorRegistry()
    shadow.start(ShadowMetrics(registry, model="m", track="stable"), lambda: "1")
    return shadow, registry


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(
        name,
        {"model": "m", "version": "1", "track": "stable", "shadow_version": "shadow", **labels},
    )
    return found or 0.0


def _embedding_answer(rows: list[list[float]]) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    return json.dumps({"object": "list", "data": data}).encode()


def _copy(kind: Kind = Kind.EMBEDDINGS, answer: bytes = b"", body: bytes = b"{}") -> Copy:
    return Copy(
        kind=kind, target=TARGET, path="/v1/embeddings", headers={}, body=bytearray(body),
        status=200, answer=bytearray(answer),
    )  # fmt: skip


def test_config_is_off_by_default_and_refuses_other_schemes() -> None:
    assert make_config().shadow.url is None
    assert ShadowConfig(url="https://next.ns.svc:8443/base").url is not None
    for bad in ("ftp://next", "next.ns.svc", "http://", "http://a b"):
        with pytest.raises(ValidationError):
            ShadowConfig(url=bad)
    with pytest.raises(ValidationError):
        ShadowConfig(url=URL, fraction=0)
    with pytest.raises(ValidationError, match="shadow.ca_file"):
        ShadowConfig(url=URL, ca_file=Path("/nonexistent/ca.crt"))


def test_mirrorable_paths() -> None:
    assert kind_of("/v1/embeddings") is Kind.EMBEDDINGS
    assert kind_of("/v2/models/m/infer") is Kind.INFER
    assert kind_of("/v1/models/m:predict") is Kind.PREDICT
    assert kind_of("/v1/completions") is Kind.COMPLETION
    assert kind_of("/v1/chat/completions") is Kind.CHAT
    assert kind_of("/v2/models/m/versions/2/infer") is None
    assert kind_of("/v2/models/m/generate") is None


def test_sampling_takes_the_drawn_fraction_of_mirrorable_posts() -> None:
    """A draw below `fraction` copies; others, GETs and other paths never do."""

    async def run() -> None:
        low, _ = _shadow(lambda request: httpx2.Response(200), draw=0.29, fraction=0.3)
        high, _ = _shadow(lambda request: httpx2.Response(200), draw=0.3, fraction=0.3)
        assert low.sampled("POST", "/v1/embeddings") == (Kind.EMBEDDINGS, low.target)
        assert low.target is not None
        assert low.target.fraction == 0.3
        assert low.sampled("GET", "/v1/embeddings") is None
        assert low.sampled("POST", "/v2/health/ready") is None
        assert high.sampled("POST", "/v1/embeddings") is None
        await low.close()
        await high.close()

    asyncio.run(run())


def test_copies_beyond_max_concurrency_are_dropped_not_queued() -> None:
    """Two in flight at most: the other three are counted as dropped at once."""

    async def run() -> None:
        release = asyncio.Event()

        async def handler(request: httpx2.Request) -> httpx2.Response:
            await release.wait()
            return httpx2.Response(200, content=_embedding_answer([[1.0, 0.0]]))

        shadow, registry = _shadow(handler, max_concurrency=2)
        for _ in range(5):
            shadow.offer(_copy(answer=_embedding_answer([[1.0, 0.0]])))
        assert shadow.in_flight == 2
        assert _value(registry, "fleetserve_shadow_dropped_total") == 3
        assert _value(registry, "fleetserve_shadow_mirrored_total") == 0  # counted when done
        release.set()
        while shadow.in_flight:
            await asyncio.sleep(0.01)
        assert _value(registry, "fleetserve_shadow_mirrored_total") == 2
        assert _value(registry, "fleetserve_shadow_compared_total") == 2
        assert _value(registry, "fleetserve_shadow_agreed_total") == 2
        await shadow.close()

    asyncio.run(run())


def test_a_failed_primary_is_not_copied() -> None:
    async def run() -> None:
        shadow, registry = _shadow(lambda request: httpx2.Response(200))
        copy = _copy()
        copy.status = 503
        shadow.offer(copy)
        assert shadow.in_flight == 0
        assert _value(registry, "fleetserve_shadow_mirrored_total") == 0
        await shadow.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (httpx2.Response(500), "5xx"),
        (httpx2.Response(404), "4xx"),
        (httpx2.TimeoutException("slow"), "timeout"),
        (httpx2.ConnectError("refused"), "transport"),
    ],
)
def test_shadow_failures_are_counted_by_reason(
    answer: httpx2.Response | Exception, reason: str
) -> None:
    async def run() -> None:
        def handler(request: httpx2.Request) -> httpx2.Response:
            if isinstance(answer, Exception):
                raise answer
            return answer

        shadow, registry = _shadow(handler)
        shadow.offer(_copy(answer=_embedding_answer([[1.0]])))
        while shadow.in_flight:
            await asyncio.sleep(0.01)
        assert _value(registry, "fleetserve_shadow_errors_total", reason=reason) == 1
        assert _value(registry, "fleetserve_shadow_compared_total") == 0
        await shadow.close()

    asyncio.run(run())


def test_a_streamed_copy_is_sent_unstreamed_with_the_forwarded_headers() -> None:
    sent: list[httpx2.Request] = []

    async def run() -> None:
        def handler(request: httpx2.Request) -> httpx2.Response:
            sent.append(request)
            return httpx2.Response(200, json={"choices": [{"message": {"content": "a b"}}]})

        shadow, _ = _shadow(handler)
        body = {"model": "m", "messages": [], "stream": True, "stream_options": {}}
        copy = _copy(Kind.CHAT, b"data: {}\n\n", json.dumps(body).encode())
        copy.headers = {"authorization": "Bearer t"}
        copy.path = "/v1/chat/completions"
        shadow.offer(copy)
        while shadow.in_flight:
            await asyncio.sleep(0.01)
        await shadow.close()

    asyncio.run(run())
    assert str(sent[0].url) == f"{URL}/v1/chat/completions"
    assert sent[0].headers["authorization"] == "Bearer t"
    assert json.loads(sent[0].content) == {"model": "m", "messages": [], "stream": False}


def test_embeddings_compare_floats_and_base64() -> None:
    row = np.array([0.6, 0.8], dtype="<f4")
    encoded = base64.b64encode(row.tobytes()).decode()
    primary = json.dumps({"data": [{"index": 0, "embedding": encoded}]}).encode()
    result = compare(_copy(answer=primary), _embedding_answer([[0.6, 0.8]]), 0.99)
    assert result is not None
    assert (result.compared, result.agreed) == (1, 1)


def test_infer_answers_are_cut_into_rows_by_shape() -> None:
    def answer(data: list[float]) -> bytes:
        output = {"name": "o", "datatype": "FP32", "shape": [2, 2], "data": data}
        return json.dumps({"outputs": [output]}).encode()

    result = compare(_copy(Kind.INFER, answer([1, 0, 0, 1])), answer([1, 0, 1, 0]), 0.99)
    assert result is not None
    assert (result.compared, result.agreed) == (2, 1)


def test_an_unreadable_shadow_answer_disagrees_on_every_unit() -> None:
    result = compare(_copy(answer=_embedding_answer([[1.0], [1.0]])), b"not json", 0.5)
    assert result is not None
    assert (result.compared, result.agreed) == (2, 0)


def test_a_binary_primary_is_not_compared() -> None:
    assert compare(_copy(Kind.INFER, b"\x00\x01binary"), b"{}", 0.5) is None


def test_only_greedy_single_generations_are_compared() -> None:
    answer = json.dumps({"choices": [{"text": "one two"}]}).encode()

    def copy(**fields: Any) -> Copy:
        return _copy(Kind.COMPLETION, answer, json.dumps({"prompt": "p", **fields}).encode())

    assert compare(copy(temperature=0), answer, 0.99) is not None
    assert compare(copy(temperature=0, n=2), answer, 0.99) is None
    assert compare(copy(temperature=0.7), answer, 0.99) is None
    assert compare(copy(), answer, 0.99) is None


def test_a_streamed_primary_is_assembled_from_its_deltas() -> None:
    chunks: tuple[dict[str, Any], ...] = (
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "one "}}]},
        {"choices": [{"delta": {"content": "two"}}]},
        {"choices": [], "usage": {}},
    )
    events = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks)
    events += b"data: [DONE]\n\n"
    copy = _copy(Kind.CHAT, events, json.dumps({"temperature": 0}).encode())
    copy.streamed = True
    shadow_answer = json.dumps({"choices": [{"message": {"content": "one two"}}]}).encode()
    result = compare(copy, shadow_answer, 0.99)
    assert result is not None
    assert (result.compared, result.agreed) == (1, 1)
