"""The streaming client against a server that closes a kept-alive connection after a stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.stream_load import StreamRequest, run_streaming_closed_loop


class _ClosingAfterStream(BaseHTTPRequestHandler):
    """Stream a two-token SSE answer, promise keep-alive, then close the connection.

    What llama.cpp's ``llama-server`` does: its answer says ``Keep-Alive: timeout=5``, yet the
    connection is closed right after the stream's last chunk. The close reaches the client
    together with that chunk, so the client's pool still holds the connection as reusable when
    its next request takes it. The socket is corked (Linux ``TCP_CORK``) so that the answer and
    the close leave in one segment, every time: the race the benchmark lost now and then is
    lost on every request here.
    """

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        """Answer every POST as llama-server answers a streamed completion."""
        self.rfile.read(int(self.headers["Content-Length"]))
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Keep-Alive", "timeout=5, max=100")
        self.end_headers()
        token = json.dumps({"choices": [{"index": 0, "text": "x"}]})
        usage = json.dumps({"choices": [], "usage": {"completion_tokens": 2}})
        for data in (token, token, usage, "[DONE]"):
            chunk = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")
        # Sends the corked answer and the close together; the handler ends the connection.
        self.connection.shutdown(socket.SHUT_WR)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output quiet."""


@contextlib.contextmanager
def _closing_server() -> Iterator[str]:
    """Run the server on 127.0.0.1 in a thread; yield its completions URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ClosingAfterStream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_request_on_a_connection_closed_before_it_was_written_is_resent() -> None:
    """Every request is served; those whose pooled connection had closed are counted as resent.

    One client reuses its one pooled connection for each next request, so every request after
    the first meets a connection the server has just closed: aiohttp finds it closing when it
    goes to write the request and refuses the write. Without the resend, those requests fail.
    """
    requests = [StreamRequest(json.dumps({"max_tokens": 2}).encode(), 2)] * 20
    with _closing_server() as url:
        stats = asyncio.run(
            run_streaming_closed_loop(
                url, requests, concurrency=1, time_limit_s=30.0, request_timeout_s=10.0
            )
        )
    assert stats.errors == {}
    assert (stats.sent, stats.finished, stats.status_counts) == (20, 20, {200: 20})
    assert stats.generated_tokens == 40
    assert stats.resent == 19
