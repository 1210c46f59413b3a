"""Shadow mirroring: a copy of a sample of live requests to the next version, answers compared.

Before a canary takes its first share of traffic, the serving (stable) pods copy a sample
of their requests to the new version's Service (`shadow.url`) and compare its answers with
their own (`core.agreement`); the copies' answers are never returned to anyone. Mirroring
happens here, in the pod that holds the primary answer, because only here can the two be
compared: a Gateway API `RequestMirror` filter discards the mirror's answer.

`ShadowMirror` is an ASGI middleware (inside the bearer-token check, so only requests the
server accepts are copied). For a `POST` to a mirrorable path it draws the sample
(`shadow.fraction`); a sampled request's body and answer are recorded as they pass, the
answer goes to the client first and unchanged, and only once its last byte is sent is the
copy handed to `Shadow.offer`. The copy then runs as a task of its own: the primary is
neither delayed nor failed by a slow, failing or absent shadow.

The target (`core.shadow_target`) is fixed by the `shadow.*` settings, or re-read from
`shadow.file` every `shadow.poll_s` (`Shadow.follow`): the operator starts and stops a shadow
stage by writing a ConfigMap mounted there, without restarting the serving pods. A copy
keeps the target it was drawn under, so a change never splits one copy between two.

- Only answers the primary gave with 2xx are copied: a request the stable version refused
  says nothing about the shadow, and a shadow failure is then a request it failed that the
  stable version served (`fleetserve_shadow_errors_total`: 5xx, 4xx, timeout, transport).
- At most `shadow.max_concurrency` copies are in flight; a copy beyond it is dropped and
  counted (`fleetserve_shadow_dropped_total`), never queued. Each has `shadow.timeout_s`.
- Compared: embedding vectors of `/v1/embeddings`, `/v2/models/{name}/infer` (JSON
  answers; a binary-tensor answer is mirrored, not compared) and `/v1/models/{name}:predict`;
  the text of `/v1/completions` and `/v1/chat/completions` when the request is greedy
  (`temperature: 0`, one choice). Sampled generations are mirrored for errors and latency
  only. A streamed primary is copied as a non-streamed request and its streamed text is
  assembled from its events for the comparison. Versioned paths
  (`/v2/models/{name}/versions/{v}/...`) name a version the shadow does not serve and are
  not mirrored.

The copy carries the request's `Content-Type`, `Authorization` (the shadow is the same
service's next version, behind the same token), the binary-tensor header and the primary's
`X-Request-ID`, so the two log records can be matched.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import httpx2
import numpy as np
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetserve_runtime.core.agreement import Comparison, compare_texts, compare_vectors
from fleetserve_runtime.core.config_sections import ShadowConfig
from fleetserve_runtime.core.metrics import ShadowMetrics, ShadowSeries
from fleetserve_runtime.core.shadow_target import ShadowTarget, read_target
from fleetserve_runtime.generate.contracts import is_greedy
from fleetserve_runtime.server.request_body import BINARY_TENSOR_HEADER

__all__ = ["MAX_CAPTURE_BYTES", "Copy", "Kind", "Shadow", "ShadowMirror", "kind_of"]

logger = logging.getLogger(__name__)

MAX_CAPTURE_BYTES = 16 * 1024 * 1024
"""Most bytes of a sampled primary answer recorded for the comparison; a larger answer is
not copied (counted as dropped)."""
FORWARDED_HEADERS = ("content-type", "authorization", BINARY_TENSOR_HEADER)
"""The request headers a copy carries."""


class Kind(Enum):
    """A mirrorable route, by how its answers are compared."""

    EMBEDDINGS = "embeddings"
    INFER = "infer"
    PREDICT = "predict"
    COMPLETION = "completion"
    CHAT = "chat"

    @property
    def generative(self) -> bool:
        """Whether the answer is generated text (compared only when greedy)."""
        return self in (Kind.COMPLETION, Kind.CHAT)


_PATHS = (
    (re.compile(r"/v1/embeddings"), Kind.EMBEDDINGS),
    (re.compile(r"/v2/models/[^/]+/infer"), Kind.INFER),
    (re.compile(r"/v1/models/[^/]+:predict"), Kind.PREDICT),
    (re.compile(r"/v1/completions"), Kind.COMPLETION),
    (re.compile(r"/v1/chat/completions"), Kind.CHAT),
)


def kind_of(path: str) -> Kind | None:
    """The mirrorable route `path` is, or None."""
    return next((kind for pattern, kind in _PATHS if pattern.fullmatch(path)), None)


@dataclass(slots=True)
class Copy:
    """One sampled request as it passed: its body and headers, the primary's answer."""

    kind: Kind
    target: ShadowTarget
    """The target it was drawn under."""
    path: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    status: int = 0
    streamed: bool = False
    answer: bytearray = field(default_factory=bytearray)
    overflow: bool = False

    def started(self, message: Message) -> None:
        """Record the answer's status, request id and whether it streams."""
        self.status = message["status"]
        for key, value in message.get("headers", []):
            name = key.decode("latin-1").lower()
            if name == "x-request-id":
                self.headers["x-request-id"] = value.decode("latin-1")
            elif name == "content-type":
                self.streamed = value.startswith(b"text/event-stream")

    def added(self, chunk: bytes) -> None:
        """Record a chunk of the answer, up to `MAX_CAPTURE_BYTES` in all."""
        if len(self.answer) + len(chunk) > MAX_CAPTURE_BYTES:
            self.overflow = True
        elif not self.overflow:
            self.answer += chunk


def _json(data: bytes | bytearray) -> object:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _embedding_rows(data: dict[str, object]) -> list[list[float]] | None:
    """`/v1/embeddings`: each item's vector, floats or base64 little-endian float32."""
    items = data.get("data")
    if not isinstance(items, list):
        return None
    rows = []
    for item in sorted(items, key=lambda entry: entry.get("index", 0)):
        vector = item.get("embedding")
        if isinstance(vector, str):
            rows.append(np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist())
        elif isinstance(vector, list):
            rows.append(vector)
        else:
            return None
    return rows


def _predict_rows(data: dict[str, object]) -> list[list[float]] | None:
    """KServe v1 `predictions`: one row per instance."""
    predictions = data.get("predictions")
    if isinstance(predictions, list) and all(isinstance(row, list) for row in predictions):
        return predictions
    return None


def _infer_rows(data: dict[str, object]) -> list[list[float]] | None:
    """OIP v2 JSON: the first output's flat `data`, cut into rows by its `[n, dim]` shape."""
    outputs = data.get("outputs")
    output = outputs[0] if isinstance(outputs, list) and outputs else None
    if not isinstance(output, dict) or not isinstance(output.get("data"), list):
        return None
    shape, flat = output.get("shape"), output["data"]
    if not isinstance(shape, list) or len(shape) != 2 or shape[0] * shape[1] != len(flat):
        return None
    width = shape[1]
    return [flat[i * width : (i + 1) * width] for i in range(shape[0])]


_ROWS = {Kind.EMBEDDINGS: _embedding_rows, Kind.PREDICT: _predict_rows, Kind.INFER: _infer_rows}


def _rows(data: object, kind: Kind) -> list[list[float]] | None:
    """An encoder answer's vectors, or None when it holds none to compare."""
    return _ROWS[kind](data) if isinstance(data, dict) else None


def _text(data: object, kind: Kind) -> str | None:
    """A non-streamed completion's or chat answer's text."""
    choices = data.get("choices") if isinstance(data, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        return None
    text = (
        choice.get("text") if kind is Kind.COMPLETION else choice.get("message", {}).get("content")
    )
    return text if isinstance(text, str) else None


def _streamed_text(events: bytes | bytearray, kind: Kind) -> str | None:
    """The text of a streamed answer: its events' deltas in order."""
    parts = []
    for line in bytes(events).split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = _json(line[len(b"data: ") :])
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not isinstance(choices, list) or not choices:
            continue  # the usage-only chunk
        choice = choices[0]
        if kind is Kind.COMPLETION:
            part = choice.get("text")
        else:
            part = choice.get("delta", {}).get("content")
        if isinstance(part, str):
            parts.append(part)
    return "".join(parts)


def _greedy(request: object) -> bool:
    """Whether a generation request is greedy with one answer: the only kind compared."""
    if not isinstance(request, dict):
        return False
    temperature = request.get("temperature")
    return (
        isinstance(temperature, int | float)
        and is_greedy(temperature)
        and request.get("n") in (None, 1)
    )


def compare(copy: Copy, shadow_answer: bytes, min_cosine: float) -> Comparison | None:
    """The primary's answer against the shadow's; None when there is nothing to compare.

    A shadow answer without the primary's content (unparseable, another shape) is a
    disagreement at score 0 for every unit the primary has.
    """
    if copy.kind.generative:
        request = _json(copy.body)
        if not _greedy(request):
            return None
        kind = copy.kind
        mine = (
            _streamed_text(copy.answer, kind) if copy.streamed else _text(_json(copy.answer), kind)
        )
        if mine is None:
            return None
        theirs = _text(_json(shadow_answer), kind)
        return compare_texts(mine, theirs) if theirs is not None else Comparison((0.0,), 0)
    rows = _rows(_json(copy.answer), copy.kind)
    if rows is None:
        return None
    return compare_vectors(rows, _rows(_json(shadow_answer), copy.kind) or [], min_cosine)


def _unstreamed(body: bytes | bytearray) -> bytes:
    """A streamed generation request asked without streaming (the copy's answer is one body)."""
    request = _json(body)
    if not isinstance(request, dict) or not request.get("stream"):
        return bytes(body)
    request["stream"] = False
    request.pop("stream_options", None)
    return json.dumps(request).encode()


class Shadow:
    """Sends the copies: the target, the sample, the bound on copies in flight, the client.

    `draw` is the sampling's random source (tests fix it); `transport` replaces the
    network (tests). `start` binds it to the runtime's metrics once the runtime exists, and
    with `shadow.file` starts following it.
    """

    def __init__(
        self,
        config: ShadowConfig,
        *,
        draw: Callable[[], float] = random.random,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        if not config.enabled:
            msg = "a shadow needs shadow.url or shadow.file"
            raise ValueError(msg)
        self.config = config
        self.target = config.fixed_target()
        """Where copies go now; None: nothing is copied."""
        self._draw = draw
        self._transport = transport
        self._client: httpx2.AsyncClient | None = None
        self._metrics: ShadowMetrics | None = None
        self._version: Callable[[], str] = lambda: "none"
        self._tasks: set[asyncio.Task[None]] = set()
        self._follower: asyncio.Task[None] | None = None
        self._problem: str | None = None
        """Why the file was refused at the last read (logged once per change)."""

    def start(self, metrics: ShadowMetrics, version: Callable[[], str]) -> None:
        """Count in `metrics`, label by the serving `version()`, open the client, follow a file."""
        self._metrics = metrics
        self._version = version
        ca_file = self.config.ca_file
        self._client = httpx2.AsyncClient(
            transport=self._transport,
            verify=ssl.create_default_context(cafile=ca_file) if ca_file is not None else True,
            timeout=self.config.timeout_s,
            limits=httpx2.Limits(max_connections=self.config.max_concurrency),
            # An in-cluster Service is reached directly, whatever proxy the pod's env names.
            trust_env=False,
        )
        if self.config.file is not None:
            self.reload()
            self._follower = asyncio.get_running_loop().create_task(self._follow())

    def reload(self) -> None:
        """Take the target `shadow.file` holds now; a file that does not parse stops copying.

        A bad file is logged (once while it stays the same) and treated as no target: the
        stage it was meant to start then shows no data, which never passes.
        """
        path = self.config.file
        if path is None:
            return
        try:
            target, problem = read_target(path), None
        except ValueError as exc:
            target, problem = None, str(exc)
        if problem is not None and problem != self._problem:
            logger.error("shadow off: %s", problem)
        self._problem = problem
        if target != self.target:
            logger.info(
                "shadow target %s",
                "off" if target is None else f"{target.url} ({target.version_label})",
            )
            self.target = target

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_s)
            self.reload()

    async def close(self) -> None:
        """Stop following the file, cancel the copies in flight and close the client."""
        tasks = [*self._tasks, *([self._follower] if self._follower is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._follower = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def in_flight(self) -> int:
        """Copies sent and not yet answered (or failed)."""
        return len(self._tasks)

    def sampled(self, method: str, path: str) -> tuple[Kind, ShadowTarget] | None:
        """The route of a request to copy and the target now, when it is drawn; else None."""
        target = self.target
        if self._client is None or target is None or method != "POST":
            return None
        kind = kind_of(path)
        if kind is None or self._draw() >= target.fraction:
            return None
        return kind, target

    def offer(self, copy: Copy) -> None:
        """Send `copy` in a task of its own, unless `max_concurrency` copies are in flight."""
        client, metrics = self._client, self._metrics
        if not 200 <= copy.status < 300 or client is None or metrics is None:
            return
        series = metrics.series(self._version(), copy.target.version_label)
        if copy.overflow or len(self._tasks) >= self.config.max_concurrency:
            series.dropped.inc()
            return
        task = asyncio.get_running_loop().create_task(self._send(client, copy, series))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, client: httpx2.AsyncClient, copy: Copy, series: ShadowSeries) -> None:
        body = _unstreamed(copy.body) if copy.kind.generative else bytes(copy.body)
        started = time.perf_counter()
        try:
            url = copy.target.url.rstrip("/") + copy.path
            answer = await client.post(url, content=body, headers=copy.headers)
        except httpx2.TimeoutException:
            series.mirrored.inc()
            series.errors["timeout"].inc()
            return
        except httpx2.HTTPError:
            series.mirrored.inc()
            series.errors["transport"].inc()
            return
        # Counted when done and before its outcome, so that at every scrape errors and
        # compared units belong to copies already counted (the operator's trials).
        series.mirrored.inc()
        series.seconds.observe(time.perf_counter() - started)
        if answer.status_code >= 500:
            series.errors["5xx"].inc()
            return
        if answer.status_code >= 300:
            series.errors["4xx"].inc()
            return
        comparison = compare(copy, answer.content, copy.target.min_cosine)
        if comparison is None:
            return
        series.compared.inc(comparison.compared)
        series.agreed.inc(comparison.agreed)
        for score in comparison.scores:
            series.agreement.observe(score)


class ShadowMirror:
    """ASGI middleware: records sampled requests and their answers, then offers the copies.

    The answer's messages go to the client before they are recorded: the primary is sent
    exactly as the app wrote it, when the app wrote it.
    """

    def __init__(self, app: ASGIApp, *, shadow: Shadow) -> None:
        self.app = app
        self.shadow = shadow

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; when sampled, record it and offer its copy once answered."""
        drawn = (
            self.shadow.sampled(scope["method"], scope["path"]) if scope["type"] == "http" else None
        )
        if drawn is None:
            await self.app(scope, receive, send)
            return
        kind, target = drawn
        headers = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope["headers"]
            if key.decode("latin-1") in FORWARDED_HEADERS
        }
        copy = Copy(kind=kind, target=target, path=scope["path"], headers=headers)

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                copy.body += message.get("body", b"")
            return message

        async def recording_send(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                copy.started(message)
            elif message["type"] == "http.response.body":
                copy.added(message.get("body", b""))
                if not message.get("more_body", False):
                    self.shadow.offer(copy)

        await self.app(scope, recording_receive, recording_send)
