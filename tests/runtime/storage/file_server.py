"""A loopback HTTPS file server for the storage initializer's tests, with faults on demand.

Each path (its query aside) serves a `Route`: a body with a status, an ETag, ranges honoured
or not, and the faults a real store shows: a connection cut after some bytes, a stall, no
Content-Length, credentials required (401 with a challenge), a redirect. Every request's path
and headers are kept, so a test can check what the client sent (a Range, an If-Range, a
token). TLS with the certificates of `fleetserve_e2e.pki` (the server's is valid for
127.0.0.1). The OCI tests lay a registry's manifests and blobs out as routes.
"""

from __future__ import annotations

import re
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from fleetserve_e2e.pki import ClusterPki

_RANGE = re.compile(r"bytes=(\d+)-")


@dataclass
class Route:
    """What one path answers."""

    body: bytes = b""
    status: int = 200
    etag: str | None = '"v1"'
    ranges: bool = True
    """Honour `Range` (and `If-Range` against the ETag) with 206."""
    send_length: bool = True
    """Send Content-Length; without it the body ends when the connection closes."""
    cut_after: int | None = None
    """Close the connection after this many body bytes (Content-Length still says all)."""
    stall_after: int | None = None
    """Send this many body bytes, then nothing until the server stops."""
    authorization: str | None = None
    """The Authorization header required (401 with `challenge` without it)."""
    challenge: str = "Bearer"
    """The WWW-Authenticate header of that 401."""
    redirect: str | None = None
    """Answer 302 to this location."""
    headers: dict[str, str] = field(default_factory=dict)
    """More headers of every answer (a Content-Type)."""


@dataclass(frozen=True)
class Seen:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FileServer:
    """The server's routes (mutable between requests) and what it has seen."""

    port: int
    routes: dict[str, Route] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def url(self, path: str) -> str:
        """The https URL of `path` on this server."""
        return f"https://127.0.0.1:{self.port}{path}"


class _Server(ThreadingHTTPServer):
    """The HTTP server, holding the routes and what it saw, and the stop that ends stalls."""

    daemon_threads = True

    def __init__(self, state: FileServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self.stopping = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests assert on `seen`, not on a log."""

    def do_GET(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server.state.seen.append(Seen(self.command, self.path, headers))
        route = self.server.state.routes.get(urlsplit(self.path).path)
        if route is None:
            self._answer(404, b"not found")
        elif route.redirect is not None:
            etag = {} if route.etag is None else {"ETag": route.etag}
            self._answer(302, b"", {**route.headers, **etag, "Location": route.redirect})
        elif route.authorization not in (None, headers.get("authorization")):
            self._answer(401, b"no", {"WWW-Authenticate": route.challenge})
        elif route.status != 200:
            self._answer(route.status, route.body or b"failure", route.headers)
        else:
            self._serve(route, headers)

    def _serve(self, route: Route, headers: dict[str, str]) -> None:
        start = _range_start(route, headers)
        body = route.body[start:]
        self.send_response(206 if start else 200)
        if route.etag:
            self.send_header("ETag", route.etag)
        if start:
            self.send_header(
                "Content-Range", f"bytes {start}-{len(route.body) - 1}/{len(route.body)}"
            )
        for name, value in route.headers.items():
            self.send_header(name, value)
        if route.send_length:
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command == "HEAD":
            return
        limit = route.cut_after if route.cut_after is not None else route.stall_after
        self.wfile.write(body if limit is None else body[:limit])
        self.wfile.flush()
        if route.stall_after is not None:
            self.server.stopping.wait(30)
        self.close_connection = limit is not None or not route.send_length

    def _answer(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()


def _range_start(route: Route, headers: dict[str, str]) -> int:
    """Where the answer starts: the Range asked for, if honoured and If-Range still holds."""
    match = _RANGE.fullmatch(headers.get("range", ""))
    if not route.ranges or match is None:
        return 0
    if "if-range" in headers and headers["if-range"] != route.etag:
        return 0
    return int(match.group(1))


@contextmanager
def file_server(pki: ClusterPki) -> Iterator[FileServer]:
    """A running server on a free loopback port, stopped on exit (stalls released)."""
    state = FileServer(port=0)
    httpd = _Server(state)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    state.port = httpd.server_address[1]
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="file-server", daemon=True
    )
    thread.start()
    try:
        yield state
    finally:
        httpd.stopping.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
