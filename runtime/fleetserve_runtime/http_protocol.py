"""uvicorn's httptools protocol with the limits it lacks: a header read timeout and size cap.

uvicorn with httptools waits forever for a request's headers and takes headers of any size,
so a client trickling one header byte at a time ("slowloris") holds a connection for good,
and one endless header line grows memory. `hardened_protocol` returns a subclass that

- closes a connection whose request headers are not complete within `header_timeout_s`,
  counted from the connection's start, or from the first byte of a later request on a
  kept-alive connection; a request that had begun is answered 408 first;
- answers 431 once request line and headers exceed `max_header_bytes`, counting what
  httptools has reported and what it still buffers (whole chunks received mid-headers);
- answers malformed requests with the runtime's JSON error shape, not uvicorn's plain text.

These answers are written before any ASGI app runs, and close the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from fleetserve_runtime.logs import request_id_from

__all__ = ["HardenedHttpToolsProtocol", "hardened_protocol"]

log = logging.getLogger("fleetserve.http")


class _Rejected(Exception):
    """Stops httptools mid-parse; the answer waits in `HardenedHttpToolsProtocol._rejection`."""


class HardenedHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` plus a header read timeout and a header size limit (class settings)."""

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
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_headers = False
        self._began_in_chunk = False
        self._header_bytes = 0
        self._buffered_bytes = 0
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
        """Feed the parser; count chunks that arrive wholly inside one request's headers."""
        self._began_in_chunk = False
        super().data_received(data)
        if self._in_headers and not self._began_in_chunk and not self.transport.is_closing():
            # httptools buffers a header line until it ends, so what it reported so far can
            # undercount; bytes of chunks that neither began nor completed the headers are
            # all header bytes, and bound the buffer.
            self._buffered_bytes += len(data)
            if self._buffered_bytes > self.max_header_bytes:
                self._answer(431, self._too_large())

    # -- parser callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A request's first byte: count its headers from zero, under the header clock."""
        super().on_message_begin()
        self._in_headers = True
        self._began_in_chunk = True
        self._header_bytes = 0
        self._buffered_bytes = 0
        if self._header_timer is None:
            self._arm_header_timer()

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

    def _request_id(self) -> str:
        sent = next((value for name, value in self.headers or [] if name == b"x-request-id"), None)
        return request_id_from(None if sent is None else sent.decode("latin-1"))

    def _answer(self, status: int, message: str) -> None:
        """Write a JSON error and close; only close when a response is already under way."""
        self._cancel_header_timer()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        request_id = self._request_id()
        log.info("request refused", extra={"status": status, "why": message})
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
