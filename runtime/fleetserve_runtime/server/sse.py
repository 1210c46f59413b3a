"""One generation answered over HTTP: a whole JSON body, or Server-Sent Events as it runs.

`GenerationResponse` is the ASGI answer the generation routes return; a `Format` says how
one API (OpenAI chat, OpenAI completions, OIP generate) writes the events. Its rules:

- The status is decided by the first event: an error raised before it (the deadline passed
  in the queue, the server stops) is answered as a plain JSON error with its own status.
  Only then does a stream begin (`200`, `text/event-stream`).
- Each text delta is one `data: {json}` event (of choice `index`, for `n` > 1). Each choice
  ends with the format's closing events (finish reason), the stream with the `final`
  choice's (and the usage), or, when generation fails midway, with one error event;
  then the format's terminator (`data: [DONE]` for OpenAI) and the end of the body.
- The client hanging up is noticed while waiting for any event (the ASGI `http.disconnect`
  message, watched alongside), not only at the next write: the generation is closed at
  once, so its sequence leaves the batch at the engine's next step and frees its blocks.
  The stream is closed when the answer ends in any way.
- A client that stops reading cannot hold the server: the engine's events go through a
  per-stream buffer of `StreamLimits.buffer_bytes` of SSE bytes, and a write that waits
  `StreamLimits.send_timeout_s` for the client to take bytes cuts the stream, as does a
  buffer past its bound. A cut stream's generation is cancelled (its KV blocks freed) and
  its connection reset where the server offers `STREAM_CONNECTION` (`http_protocol`):
  a plain close would keep the unsent bytes, and the socket, until the client reads them.
  There the connection's kernel send buffer is also bounded when a stream starts: the
  kernel grows it to megabytes for a peer that does not read, which would hold a whole
  answer before any write waits, out of reach of both bounds.
- `on_done(code)` is called once, when the answer is over (a stream: once its last byte
  is written), with the status the request counts under in the metrics: 200, the error's
  status (also for an error inside a stream, so a canary that fails midway shows as
  failing), or 499 when the client left or stopped taking the stream; `on_cut(limit)`
  first, for a cut stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from fleetserve_runtime.core.metrics import StreamLimit
from fleetserve_runtime.generate.contracts import (
    ErrorEvent,
    FinishEvent,
    GenerationEvent,
    TokenEvent,
)
from fleetserve_runtime.server.http_errors import Failure
from fleetserve_runtime.server.http_protocol import STREAM_CONNECTION, StreamConnection
from fleetserve_runtime.serving.facade import GenerationEvents

__all__ = [
    "CLIENT_CLOSED",
    "DONE",
    "Format",
    "GenerationResponse",
    "StreamLimits",
    "sse_event",
]

DONE = b"data: [DONE]\n\n"
"""OpenAI's end-of-stream event."""
CLIENT_CLOSED = 499
"""The metrics code of a request whose client hung up first (nginx's convention)."""
WRITE_BYTES = 65_536
"""Most buffered bytes one write hands the connection: uvicorn's write buffer takes a whole
write past its high-water mark (64 KiB), so this keeps a stalled client's share of server
memory near `StreamLimits.buffer_bytes` plus twice that mark."""
DROP_NOTICE_S = 1.0
"""How long a cut stream waits for the server to report the reset connection, so that the
server sees a client gone, not an app that left a response unfinished."""
SSE_HEADERS = {
    "cache-control": "no-cache",
    # Proxies that buffer responses (nginx) would hold tokens back until the end.
    "x-accel-buffering": "no",
}


def sse_event(payload: object) -> bytes:
    """One Server-Sent Event carrying `payload` as JSON."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class Format(Protocol):
    """How one API writes a generation; payloads are JSON-serialisable objects."""

    @property
    def terminator(self) -> bytes:
        """Written after a stream's last event (`DONE`, or nothing)."""
        ...

    def opening(self) -> list[object]:
        """Events before the first text (OpenAI chat: the assistant's role)."""
        ...

    def delta(self, event: TokenEvent) -> object | None:
        """The event of a text delta of choice `event.index`; None: nothing to send.

        It carries the event's log-probabilities and echoed prompt where the API shows them.
        """
        ...

    def closing(self, finish: FinishEvent) -> list[object]:
        """Events after a choice's last text: its finish reason; usage on the `final` one."""
        ...

    def whole(
        self, choices: Sequence[Sequence[TokenEvent]], finishes: Sequence[FinishEvent]
    ) -> object:
        """The body of a generation answered at once (`stream: false`), choice by choice.

        `choices` holds each choice's text events, `finishes` its finish, in index order.
        """
        ...

    def failure(self, error: Exception) -> Failure:
        """How `error` is answered (a domain error's status; 500 with an error id otherwise)."""
        ...


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What a client that does not keep up with its stream may cost (module docstring)."""

    send_timeout_s: float
    buffer_bytes: int


class _Cut(Exception):
    """A stream's client stopped taking it; `limit` says which bound it reached."""

    def __init__(self, limit: StreamLimit) -> None:
        super().__init__(limit)
        self.limit: StreamLimit = limit


class _Outbox:
    """A stream's SSE bytes between the engine and the client's writes, bounded in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.code: int | None = None
        """The stream's status once its last event is in."""
        self._chunks: deque[bytes] = deque()
        self._ready = asyncio.Event()

    def put(self, chunks: list[bytes], code: int | None) -> None:
        """Add one event's bytes (`code`: it was the last); `_Cut` past the bound."""
        for chunk in chunks:
            self._chunks.append(chunk)
            self.size += len(chunk)
        self.code = code
        if self.size > self.limit:
            raise _Cut("buffer")
        self._ready.set()

    async def take(self) -> tuple[bytes, int | None]:
        """The next bytes to write, and the stream's status when they end it.

        At most `WRITE_BYTES`, unless one event alone is larger.
        """
        while not self._chunks and self.code is None:
            self._ready.clear()
            await self._ready.wait()
        pieces: list[bytes] = []
        taken = 0
        while self._chunks and taken < WRITE_BYTES:
            pieces.append(self._chunks.popleft())
            taken += len(pieces[-1])
        self.size -= taken
        return b"".join(pieces), None if self._chunks else self.code


@dataclass(eq=False)
class GenerationResponse(Response):
    """The ASGI answer of one generation; see the module docstring."""

    stream: GenerationEvents
    fmt: Format
    _: KW_ONLY
    streaming: bool
    limits: StreamLimits
    on_done: Callable[[int], None]
    on_cut: Callable[[StreamLimit], None]
    _done: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        super().__init__()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer, watching for the client to hang up; close the stream in every case."""
        code = CLIENT_CLOSED
        conn: StreamConnection | None = scope.get("extensions", {}).get(STREAM_CONNECTION)
        watcher = asyncio.ensure_future(_disconnected(receive))
        answer = asyncio.ensure_future(
            self._stream(send, conn) if self.streaming else self._whole(send)
        )
        try:
            await asyncio.wait({watcher, answer}, return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                code = 500  # what a bug raising from `result()` counts as
                code = answer.result()
                if self.streaming and code == CLIENT_CLOSED and conn is not None:
                    await asyncio.wait({watcher}, timeout=DROP_NOTICE_S)
        finally:
            for task in (answer, watcher):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answer
            await self.stream.aclose()
            self._finish(code)

    def _finish(self, code: int) -> None:
        """Call `on_done` once: at the stream's last byte, or when the answer is over."""
        if not self._done:
            self._done = True
            self.on_done(code)

    async def _whole(self, send: Send) -> int:
        tokens: dict[int, list[TokenEvent]] = {}
        finishes: dict[int, FinishEvent] = {}
        try:
            async for event in self.stream:
                if isinstance(event, TokenEvent):
                    tokens.setdefault(event.index, []).append(event)
                elif isinstance(event, FinishEvent):
                    finishes[event.index] = event
                    if not event.final:
                        continue
                    order = sorted(finishes)
                    body = self.fmt.whole(
                        [tokens.get(index, []) for index in order],
                        [finishes[index] for index in order],
                    )
                    await _send_json(send, 200, body, {})
                    return 200
                else:
                    return await self._fail(send, event.error)
        except Exception as exc:  # domain errors before the first event; bugs answered as 500s
            return await self._fail(send, exc)
        return await self._fail(send, RuntimeError("generation ended without a finish event"))

    async def _stream(self, send: Send, conn: StreamConnection | None) -> int:
        """Stream the events: the engine's side fills the outbox, the client's side empties it.

        Either side may cut the stream (`_Cut`); then the connection is dropped and the
        stream counts as 499 (`__call__` closes the generation).
        """
        events = aiter(self.stream)
        try:
            event = await anext(events)
        except StopAsyncIteration:
            return await self._fail(send, RuntimeError("generation ended without any event"))
        except Exception as exc:  # domain errors before the first event; bugs answered as 500s
            return await self._fail(send, exc)
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        headers += [(k.encode(), v.encode()) for k, v in SSE_HEADERS.items()]
        if conn is not None:
            conn.bound_kernel_buffer()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        outbox = _Outbox(self.limits.buffer_bytes)
        outbox.put([sse_event(payload) for payload in self.fmt.opening()], None)
        pump = asyncio.ensure_future(self._pump(event, events, outbox))
        writer = asyncio.ensure_future(self._write_all(send, outbox))
        try:
            await asyncio.wait({pump, writer}, return_when=asyncio.FIRST_COMPLETED)
            if not writer.done():
                pump.result()  # raises `_Cut` when the client fell a buffer behind
            return await writer
        except _Cut as cut:
            self.on_cut(cut.limit)
            if conn is not None:
                conn.reset()
            return CLIENT_CLOSED
        finally:
            for task in (pump, writer):
                task.cancel()
            await asyncio.gather(pump, writer, return_exceptions=True)

    async def _write_all(self, send: Send, outbox: _Outbox) -> int:
        """Write `outbox` to the client until the stream's end; its status, or `_Cut`."""
        while True:
            body, code = await outbox.take()
            try:
                async with asyncio.timeout(self.limits.send_timeout_s):
                    await _send_body(send, body, more=code is None)
            except TimeoutError:
                raise _Cut("send_timeout") from None
            if code is not None:
                # Now, before any other task runs: the client may hang up, or send its next
                # request (which the server starts now), before the tasks have ended.
                self._finish(code)
                return code

    async def _pump(
        self, event: GenerationEvent, events: AsyncIterator[GenerationEvent], outbox: _Outbox
    ) -> None:
        """Put `event` and the rest of the stream's events into `outbox`, up to its bound."""
        while True:
            chunks: list[bytes] = []
            code = self._write(event, chunks)
            # A token whose text is held back (an open character) adds no bytes.
            if chunks or code is not None:
                outbox.put(chunks, code)
            if code is not None:
                return
            try:
                event = await anext(events)
            except StopAsyncIteration:
                event = ErrorEvent(RuntimeError("generation ended without a finish event"))
            except Exception as exc:  # the stream's contract says ErrorEvent; be safe anyway
                event = ErrorEvent(exc)

    def _write(self, event: GenerationEvent, chunks: list[bytes]) -> int | None:
        """Add `event`'s SSE events to `chunks`; the status the stream ends with, if it ends."""
        if isinstance(event, TokenEvent):
            payload = self.fmt.delta(event)
            if payload is not None:
                chunks.append(sse_event(payload))
            return None
        if isinstance(event, FinishEvent):
            chunks.extend(sse_event(payload) for payload in self.fmt.closing(event))
            if not event.final:
                return None
            chunks.append(self.fmt.terminator)
            return 200
        failure = self.fmt.failure(event.error)
        chunks.append(sse_event(failure.body))
        chunks.append(self.fmt.terminator)
        return failure.status

    async def _fail(self, send: Send, error: Exception) -> int:
        failure = self.fmt.failure(error)
        await _send_json(send, failure.status, failure.body, failure.headers)
        return failure.status


async def _disconnected(receive: Receive) -> None:
    """Return once the client has hung up (the body was read before the answer began)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_body(send: Send, body: bytes, *, more: bool) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more})


async def _send_json(send: Send, status: int, body: object, headers: Mapping[str, str]) -> None:
    raw = orjson.dumps(body)
    head: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(raw)).encode()),
    ]
    head += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await _send_body(send, raw, more=False)
