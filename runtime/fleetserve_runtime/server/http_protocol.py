"""uvicorn's httptools protocol with the limits it lacks: connection clocks and a header cap.

uvicorn with httptools waits forever for a request's headers and takes headers of any size,
so a client trickling one header byte at a time ("slowloris") holds a connection for good,
and one endless header line grows memory. Its keep-alive timer is no bound either: every
byte received restarts it, even bytes it discards (the body of a request that was answered
without reading it) or skips (blank lines between requests). `hardened_protocol` returns a
subclass that

- closes a connection whose request headers are not complete within `header_timeout_s`,
  counted from the connection's start, or from the first byte of a later request on a
  kept-alive connection; a request that had begun is answered 408 first;
- closes a kept-alive connection on which no request begins within `header_timeout_s` of
  the last response; blank lines (which the parser skips) do not count as a beginning;
- closes the connection after a response that was started before the request's body was
  fully received (a 401, 404, 413 or 415 answered without reading it, a probe ignoring
  one), with `Connection: close`, so the rest of the body cannot hold it open;
- answers 431 once request line and headers exceed `max_header_bytes`, counting what
  httptools has reported and what it still buffers (whole chunks received mid-headers);
  bytes received between requests count towards the same limit;
- answers malformed requests with the runtime's JSON error shape, not uvicorn's plain text.

These answers are written before any ASGI app answers, and close the connection. Where a
response to an earlier request is still due, nothing can be answered in its place: the
connection is only closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
from collections.abc import MutableMapping
from typing import Any, ClassVar

from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, ASGISendEvent
from uvicorn._types import Scope as AsgiScope
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from fleetserve_runtime.core.logs import request_id_from

__all__ = [
    "STREAM_CONNECTION",
    "HardenedHttpToolsProtocol",
    "StreamConnection",
    "hardened_protocol",
    "offer_connection",
]

log = logging.getLogger("fleetserve.http")

_PARSER_WARNING = "Invalid HTTP request received."

STREAM_CONNECTION = "fleetserve.stream_connection"
"""The ASGI scope extension (`offer_connection`): the request's `StreamConnection`."""
KERNEL_SEND_BUFFER = 65_536
"""`SO_SNDBUF` of a streaming connection (Linux doubles it): a token stream needs little."""


class StreamConnection:
    """What a stream may do to its HTTP/1.1 connection beyond ASGI (`sse` cuts streams with it)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def bound_kernel_buffer(self) -> None:
        """Cap the kernel's send buffer at `KERNEL_SEND_BUFFER` for the rest of the connection."""
        self._setsockopt(socket.SO_SNDBUF, KERNEL_SEND_BUFFER)

    def reset(self) -> None:
        """Close the connection at once, discarding its unsent bytes, with a TCP reset."""
        # Lingering 0 s, the kernel frees the send buffer and resets, not an orphan socket
        # probing a zero window for minutes.
        self._setsockopt(socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._transport.abort()

    def _setsockopt(self, option: int, value: int | bytes) -> None:
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, option, value)


def offer_connection(scope: MutableMapping[str, Any], transport: asyncio.Transport) -> None:
    """Offer the app `STREAM_CONNECTION` for this request's connection (a server's hook)."""
    scope.setdefault("extensions", {})[STREAM_CONNECTION] = StreamConnection(transport)


class _WithoutParserWarning(logging.Filter):
    """Drops uvicorn's bare parser warning: `_answer` logs the refusal, with the request id."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the one record to drop."""
        return record.msg != _PARSER_WARNING


_uvicorn_log = logging.getLogger("uvicorn.error.http")
"""uvicorn's own records from this protocol; a child of `uvicorn.error`, where they go."""
_uvicorn_log.addFilter(_WithoutParserWarning())


class _Rejected(Exception):
    """Stops httptools mid-parse; the answer waits in `HardenedHttpToolsProtocol._rejection`."""


class HardenedHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` plus connection clocks and a header size limit (class settings)."""

    header_timeout_s: ClassVar[float] = 10.0
    max_header_bytes: ClassVar[int] = 16_384

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.logger = _uvicorn_log
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle = False
        """True from a response's end until the next request's first byte."""
        self._in_message = False
        self._in_headers = False
        self._began_in_chunk = False
        self._completed_in_chunk = False
        self._header_bytes = 0
        self._buffered_bytes = 0
        self._idle_bytes = 0
        self._rejection: tuple[int, str] | None = None

    # -- connection events -------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the header clock: a connection that never sends a request is closed too."""
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the header clock."""
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; count chunks that arrive wholly inside headers or between requests."""
        self._began_in_chunk = self._completed_in_chunk = False
        super().data_received(data)
        if self.transport.is_closing() or self._began_in_chunk or self._completed_in_chunk:
            return
        # httptools buffers a header line until it ends, so what it reported so far can
        # undercount; and it skips blank lines between requests without a callback. Bytes of
        # chunks that neither began nor completed a request are all header bytes, or all
        # idle bytes: they bound the buffer, and a stream of blank lines.
        if self._in_headers:
            self._buffered_bytes += len(data)
            if self._buffered_bytes > self.max_header_bytes:
                self._answer(431, self._too_large())
        elif not self._in_message:
            self._idle_bytes += len(data)
            if self._idle_bytes > self.max_header_bytes:
                self._answer(431, self._too_large())

    def on_response_complete(self) -> None:
        """A response went out: unless another request is due, wait for the next one, idle."""
        awaiting = not self.pipeline and not self._in_message
        super().on_response_complete()
        if awaiting and not self.transport.is_closing():
            self._cancel_header_timer()
            self._idle = True
            self._idle_bytes = 0
            self._arm_header_timer()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """Run `app` for `cycle`; a response started before the body was read closes after.

        The app is offered the connection (`offer_connection`), so a stream whose client
        stops reading can bound the socket's send buffer and reset it when cut.
        """
        transport = self.transport

        async def close_if_body_unread(
            scope: AsgiScope, receive: ASGIReceiveCallable, send: ASGISendCallable
        ) -> None:
            async def send_closing(message: ASGISendEvent) -> None:
                if message["type"] == "http.response.start" and cycle.more_body:
                    # uvicorn then says `Connection: close`, and closes after the response.
                    cycle.keep_alive = False
                await send(message)

            offer_connection(scope, transport)  # type: ignore[arg-type]  # a TypedDict is a mapping
            await app(scope, receive, send_closing)

        super()._start_asgi_task(cycle, close_if_body_unread)

    # -- parser callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A request's first byte: count its headers from zero, under the header clock."""
        super().on_message_begin()
        self._in_message = self._in_headers = self._began_in_chunk = True
        self._header_bytes = self._buffered_bytes = 0
        if self._header_timer is None or self._idle:
            self._cancel_header_timer()
            self._arm_header_timer()
        self._idle = False

    def on_url(self, url: bytes) -> None:
        """Count the request target towards the header limit."""
        super().on_url(url)
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count one header line (name, value and four bytes of separators) towards the limit."""
        super().on_header(name, value)
        self._count(len(name) + len(value) + 4)

    def on_headers_complete(self) -> None:
        """The headers arrived in time: stop the clock and hand the request on."""
        self._cancel_header_timer()
        self._in_headers = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The whole request arrived; bytes until the next one are idle bytes."""
        super().on_message_complete()
        self._in_message = False
        self._completed_in_chunk = True

    def send_400_response(self, msg: str) -> None:
        """Answer a request the parser refused: our 431, or a JSON 400 for malformed HTTP."""
        status, message = self._rejection or (400, "malformed HTTP request")
        self._answer(status, message)

    # -- helpers -----------------------------------------------------------------------

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.max_header_bytes:
            self._rejection = (431, self._too_large())
            raise _Rejected

    def _too_large(self) -> str:
        return f"request headers exceed {self.max_header_bytes} bytes (max_header_bytes)"

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_overdue)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_overdue(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if not self._in_headers:
            self.transport.close()
            return
        timeout = f"{self.header_timeout_s:g}"
        self._answer(408, f"request headers not received within {timeout} s (header_timeout_s)")

    def _next_response_is_ours(self) -> bool:
        """Whether an answer written now is the response the client waits for next.

        It is when no request is in flight, or when the one in flight is the request being
        parsed (its body was not complete) and its app has not started answering.
        """
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return True
        return not cycle.response_started and not self.pipeline and cycle.more_body

    def _request_id(self) -> str:
        headers = self.headers if self._in_message else None
        sent = next((value for name, value in headers or [] if name == b"x-request-id"), None)
        return request_id_from(None if sent is None else sent.decode("latin-1"))

    def _answer(self, status: int, message: str) -> None:
        """Write a JSON error and close; only close when another response is due first."""
        self._cancel_header_timer()
        if self.transport.is_closing():
            return
        if not self._next_response_is_ours():
            self.transport.close()
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # The app of this request must not answer too: it sees the client gone.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        request_id = self._request_id()
        log.info(
            "request refused", extra={"status": status, "why": message, "request_id": request_id}
        )
        body = json.dumps({"error": message, "request_id": request_id}).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"x-request-id: " + request_id.encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def hardened_protocol(
    *, header_timeout_s: float, max_header_bytes: int
) -> type[HardenedHttpToolsProtocol]:
    """The protocol class to pass as `uvicorn.Config(http=...)`, with these limits."""

    class Configured(HardenedHttpToolsProtocol):
        pass

    Configured.header_timeout_s = header_timeout_s
    Configured.max_header_bytes = max_header_bytes
    return Configured
