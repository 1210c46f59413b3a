"""An HTTPS static file server on loopback, with Range requests and injectable faults.

Model downloads over plain HTTPS are tested against it: it serves a directory on 127.0.0.1
with a certificate signed by the CA it is given, answers single-range ``Range`` requests with
206 (and ``If-Range`` by ETag), and on request misbehaves for the next matching request:

- ``stall``: send the headers and the first ``after_bytes`` of the body, then nothing until
  ``hold_s`` passes or the server stops (a client's read timeout must fire);
- ``cut``: send the first ``after_bytes`` of the body, then close the connection (a client
  must notice the short body, and may resume with ``Range``);
- ``error``: answer ``status`` (500 by default) with no body.

It records every request (method, path, ``Range`` header, status), so a test can check that
a client resumed where it stopped. It runs in the test process, on threads.
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from fleetserve_e2e.lifecycle import Component, started
from fleetserve_e2e.pki import LocalCa, issue_loopback_cert

FaultKind = Literal["stall", "cut", "error"]
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 64 * 1024
# An idle keep-alive connection, or a client that stops reading, frees its thread after this.
_SOCKET_TIMEOUT_S = 30.0

FILES_SERVER_NAME = "fleetserve-files"
"""The name in the server's certificate (beside localhost and 127.0.0.1), by which a
container reaches it (`LocalCluster(host_names=...)`)."""


@dataclass(frozen=True)
class Fault:
    """A misbehaviour for one request (see the module docstring).

    Args:
        kind: ``stall``, ``cut`` or ``error``.
        path: Only a request for this URL path (``/dir/file``) triggers it; any when None.
        after_bytes: For ``stall`` and ``cut``: body bytes sent first.
        status: For ``error``: the status answered.
        hold_s: For ``stall``: how long the connection stays silent before it is closed.
    """

    kind: FaultKind
    path: str | None = None
    after_bytes: int = 0
    status: int = HTTPStatus.INTERNAL_SERVER_ERROR
    hold_s: float = 60.0


@dataclass(frozen=True)
class ServedRequest:
    """One request as the server saw it: the status it answered, and the fault it met."""

    method: str
    path: str
    range: str | None
    status: int
    fault: FaultKind | None = None


@dataclass(frozen=True)
class ByteRange:
    """An inclusive byte range of a file: ``first`` to ``last``."""

    first: int
    last: int

    @property
    def length(self) -> int:
        """Bytes in the range."""
        return self.last - self.first + 1


class UnsatisfiableRangeError(ValueError):
    """The range starts past the end of the file."""


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The range a ``Range`` header asks of a ``size``-byte file; None to send it whole.

    A header that is not one ``bytes=`` range (several ranges, another unit) is ignored, as
    RFC 9110 allows.

    Raises:
        UnsatisfiableRangeError: The range starts at or past the end of the file.
    """
    match = _RANGE.match(header or "")
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first_text, last_text = match.groups()
    if first_text == "":  # a suffix: the last N bytes
        suffix = int(last_text)
        if suffix == 0 or size == 0:
            raise UnsatisfiableRangeError(header)
        return ByteRange(max(size - suffix, 0), size - 1)
    first = int(first_text)
    if first >= size:
        raise UnsatisfiableRangeError(header)
    last = size - 1 if last_text == "" else min(int(last_text), size - 1)
    if last < first:
        return None
    return ByteRange(first, last)


def file_etag(path: Path) -> str:
    """A strong ETag from the file's size and modification time."""
    stat = path.stat()
    digest = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return f'"{digest[:32]}"'


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        # The handshake runs on the handler's thread, at its first read: a client that never
        # completes one cannot hold up the accept loop.
        self.socket = context.wrap_socket(
            self.socket, server_side=True, do_handshake_on_connect=False
        )
        self.root = root
        self.lock = threading.Lock()
        self.faults: deque[Fault] = deque()
        self.served: list[ServedRequest] = []
        self.headers: dict[str, dict[str, str]] = {}
        self.stopping = threading.Event()

    def take_fault(self, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.path is None or fault.path == path:
                    self.faults.remove(fault)
                    return fault
        return None

    def record(self, request: ServedRequest) -> None:
        with self.lock:
            self.served.append(request)

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        """Ignore a client that went away or spoke no TLS; report anything else."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = _SOCKET_TIMEOUT_S
    server: _Server

    def do_GET(self) -> None:
        """Serve a file, a range of it, or the next fault."""
        self._serve(body=True)

    def do_HEAD(self) -> None:
        """Headers only."""
        self._serve(body=False)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: requests are recorded in ``served`` instead of printed."""

    def _serve(self, *, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        requested_range = self.headers.get("Range")
        fault = self.server.take_fault(path)
        if fault is not None and fault.kind == "error":
            self._empty(fault.status)
            self._record(path, requested_range, fault.status, fault)
            return
        file = self._resolve(path)
        if file is None:
            self._empty(HTTPStatus.NOT_FOUND)
            self._record(path, requested_range, HTTPStatus.NOT_FOUND)
            return
        size = file.stat().st_size
        etag = file_etag(file)
        if_range = self.headers.get("If-Range")
        try:
            byte_range = parse_range(requested_range if if_range in (None, etag) else None, size)
        except UnsatisfiableRangeError:
            self._empty(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, {"Content-Range": f"*/{size}"})
            self._record(path, requested_range, HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            return
        selected = byte_range or ByteRange(0, size - 1)
        status = HTTPStatus.OK if byte_range is None else HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(max(selected.length, 0)),
            "Accept-Ranges": "bytes",
            "ETag": etag,
        }
        if byte_range is not None:
            headers["Content-Range"] = f"bytes {selected.first}-{selected.last}/{size}"
        with self.server.lock:
            headers.update(self.server.headers.get(path, {}))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self._record(path, requested_range, status, fault)
        if body:
            self._send_body(file, selected, fault)

    def _send_body(self, file: Path, selected: ByteRange, fault: Fault | None) -> None:
        limit = selected.length if fault is None else min(fault.after_bytes, selected.length)
        with file.open("rb") as stream:
            stream.seek(selected.first)
            remaining = limit
            while remaining > 0:
                chunk = stream.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)
        self.wfile.flush()
        if fault is None:
            return
        if fault.kind == "stall":
            self.server.stopping.wait(fault.hold_s)
        self.close_connection = True
        # Shut the socket at once, so the client sees the body end short, not a clean close
        # that could pass for a complete keep-alive response.
        self.connection.shutdown(socket.SHUT_RDWR)

    def _resolve(self, path: str) -> Path | None:
        root = self.server.root.resolve()
        candidate = (root / path.lstrip("/")).resolve()
        if not candidate.is_relative_to(root) or not candidate.is_file():
            return None
        return candidate

    def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {**(headers or {}), "Content-Length": "0"}.items():
            self.send_header(name, value)
        self.end_headers()

    def _record(
        self, path: str, requested_range: str | None, status: int, fault: Fault | None = None
    ) -> None:
        kind = None if fault is None else fault.kind
        self.server.record(ServedRequest(self.command, path, requested_range, status, kind))


@dataclass(eq=False)
class HttpsFileServer(Component):
    """Context manager serving ``root`` over HTTPS on 127.0.0.1; stopped on exit.

    Nothing starts before ``__enter__``.

    Attributes:
        root: The directory served (files may be added while it runs).
        ca: The CA that signs the server's certificate.
        tls_dir: Where the certificate and key are written.
    """

    root: Path
    ca: LocalCa
    tls_dir: Path
    _server: _Server | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    @property
    def ca_cert(self) -> Path:
        """The PEM CA that signed the server's certificate."""
        return self.ca.cert

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self._running().server_address[1]}"

    def url_for(self, relative: str) -> str:
        """The URL of a file under ``root``."""
        return f"{self.url}/{relative.lstrip('/')}"

    def set_headers(self, relative: str, headers: dict[str, str]) -> None:
        """Headers the answers for the file at ``relative`` carry, besides or over the defaults.

        A ``Content-Type``, or what a Hugging Face Hub sends with a file (``X-Repo-Commit``).
        """
        with self._running().lock:
            self._running().headers[f"/{relative.lstrip('/')}"] = dict(headers)

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each hits the next request that matches it, once."""
        with self._running().lock:
            self._running().faults.extend(faults)

    def requests(self) -> list[ServedRequest]:
        """Every request served since the start or the last :meth:`reset`, in order."""
        with self._running().lock:
            return list(self._running().served)

    def reset(self) -> None:
        """Forget queued faults, recorded requests and the files' own headers."""
        server = self._running()
        with server.lock:
            server.faults.clear()
            server.served.clear()
            server.headers.clear()

    def _running(self) -> _Server:
        return started(self._server, "the file server")

    def _start(self) -> None:
        tls = issue_loopback_cert(self.ca, self.tls_dir, FILES_SERVER_NAME)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        self.root.mkdir(parents=True, exist_ok=True)
        self._server = _Server(self.root, context)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="https-file-server", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Release stalled requests, stop serving and close the socket (idempotent)."""
        if self._server is not None:
            self._server.stopping.set()
            if self._thread is not None:
                self._server.shutdown()
                self._thread.join(timeout=10.0)
            self._server.server_close()
            self._server = None
