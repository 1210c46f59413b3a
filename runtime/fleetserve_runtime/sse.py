"""One generation answered over HTTP: a whole JSON body, or Server-Sent Events as it runs.

`GenerationResponse` is the ASGI answer the generation routes return; a `Format` says how
one API (OpenAI chat, OpenAI completions, OIP generate) writes the events. Its rules:

- The status is decided by the first event: an error raised before it (the deadline passed
  in the queue, the server stops) is answered as a plain JSON error with its own status.
  Only then does a stream begin (`200`, `text/event-stream`).
- Each text delta is one `data: {json}` event. A stream ends with the format's closing
  events (finish reason, usage) or, when generation fails midway, with one error event;
  then the format's terminator (`data: [DONE]` for OpenAI) and the end of the body.
- The client hanging up is noticed while waiting for any event (the ASGI `http.disconnect`
  message, watched alongside), not only at the next write: the generation is closed at
  once, so its sequence leaves the batch at the engine's next step and frees its blocks.
  The stream is closed when the answer ends in any way.
- `on_done(code)` is called once, when the answer is over, with the status the request
  counts under in the metrics: 200, the error's status (also for an error inside a
  stream, so a canary that fails midway shows as failing), or 499 when the client left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Protocol

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from fleetserve_runtime.facade import GenerationStream
from fleetserve_runtime.generate.contracts import (
    ErrorEvent,
    FinishEvent,
    GenerationEvent,
    TokenEvent,
)
from fleetserve_runtime.http_errors import Failure

__all__ = [
    "CLIENT_CLOSED",
    "DONE",
    "Format",
    "GenerationResponse",
    "sse_event",
]

DONE = b"data: [DONE]\n\n"
"""OpenAI's end-of-stream event."""
CLIENT_CLOSED = 499
"""The metrics code of a request whose client hung up first (nginx's convention)."""
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

    def delta(self, text: str) -> object:
        """The event of a text delta."""
        ...

    def closing(self, finish: FinishEvent) -> list[object]:
        """Events after the last text: finish reason, usage."""
        ...

    def whole(self, text: str, finish: FinishEvent) -> object:
        """The body of a generation answered at once (`stream: false`)."""
        ...

    def failure(self, error: Exception) -> Failure:
        """How `error` is answered (a domain error's status; 500 with an error id otherwise)."""
        ...


class GenerationResponse(Response):
    """The ASGI answer of one generation; see the module docstring."""

    def __init__(
        self,
        stream: GenerationStream,
        fmt: Format,
        *,
        streaming: bool,
        on_done: Callable[[int], None],
    ) -> None:
        super().__init__()
        self.stream = stream
        self.fmt = fmt
        self.streaming = streaming
        self.on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer, watching for the client to hang up; close the stream in every case."""
        code = CLIENT_CLOSED
        watcher = asyncio.ensure_future(_disconnected(receive))
        answer = asyncio.ensure_future(self._stream(send) if self.streaming else self._whole(send))
        try:
            await asyncio.wait({watcher, answer}, return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                code = 500  # what a bug raising from `result()` counts as
                code = answer.result()
        finally:
            for task in (answer, watcher):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answer
            await self.stream.aclose()
            self.on_done(code)

    async def _whole(self, send: Send) -> int:
        texts: list[str] = []
        try:
            async for event in self.stream:
                if isinstance(event, TokenEvent):
                    texts.append(event.text)
                elif isinstance(event, FinishEvent):
                    await _send_json(send, 200, self.fmt.whole("".join(texts), event), {})
                    return 200
                else:
                    return await self._fail(send, event.error)
        except Exception as exc:  # domain errors before the first event; bugs answered as 500s
            return await self._fail(send, exc)
        return await self._fail(send, RuntimeError("generation ended without a finish event"))

    async def _stream(self, send: Send) -> int:
        events = aiter(self.stream)
        try:
            event = await anext(events)
        except StopAsyncIteration:
            return await self._fail(send, RuntimeError("generation ended without any event"))
        except Exception as exc:  # domain errors before the first event; bugs answered as 500s
            return await self._fail(send, exc)
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        headers += [(k.encode(), v.encode()) for k, v in SSE_HEADERS.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunks = [sse_event(payload) for payload in self.fmt.opening()]
        while True:
            code = self._write(event, chunks)
            if code is not None:
                await _send_body(send, b"".join(chunks), more=False)
                return code
            if chunks:  # a token whose text is held back (an open character) adds none
                await _send_body(send, b"".join(chunks), more=True)
                chunks = []
            try:
                event = await anext(events)
            except StopAsyncIteration:
                event = ErrorEvent(RuntimeError("generation ended without a finish event"))
            except Exception as exc:  # the stream's contract says ErrorEvent; be safe anyway
                event = ErrorEvent(exc)

    def _write(self, event: GenerationEvent, chunks: list[bytes]) -> int | None:
        """Add `event`'s SSE events to `chunks`; the status the stream ends with, if it ends."""
        if isinstance(event, TokenEvent):
            if event.text:
                chunks.append(sse_event(self.fmt.delta(event.text)))
            return None
        if isinstance(event, FinishEvent):
            chunks.extend(sse_event(payload) for payload in self.fmt.closing(event))
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
