"""A stand-in for ``fleetserve-runtime serve``: only the endpoints the harness itself needs.

It lets the harness's own tests run before, or without, the real runtime: it answers
``GET /v2/health/ready``, ``GET /v2/health/live`` and ``GET /metrics`` on ``--host``/``--port``
and exits cleanly on SIGTERM.  It uses the standard library only, so it runs as a plain script:
``python standin_runtime.py serve --port 8080 [ignored runtime flags...]``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

_METRICS = (
    "# HELP fleetserve_standin_up Always 1: the e2e stand-in runtime is serving.\n"
    "# TYPE fleetserve_standin_up gauge\n"
    "fleetserve_standin_up 1\n"
)


class _Handler(BaseHTTPRequestHandler):
    """Serves the health and metrics endpoints; 404 for everything else."""

    def do_GET(self) -> None:
        """Answer health probes and Prometheus scrapes."""
        if self.path in ("/v2/health/ready", "/v2/health/live"):
            self._send(200, "application/json", '{"ready": true}' if "ready" in self.path else "{}")
        elif self.path == "/metrics":
            self._send(200, "text/plain; version=0.0.4", _METRICS)
        else:
            self._send(404, "application/json", '{"error": "not found"}')

    def _send(self, status: int, content_type: str, body: str) -> None:
        payload = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # stdlib signature
        """Keep probe noise out of the pod log."""


def main(argv: list[str]) -> None:
    """Serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="fleetserve-runtime (e2e stand-in)")
    parser.add_argument("subcommand", choices=["serve"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args, _runtime_flags = parser.parse_known_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), _Handler)

    def shut_down(_signum: int, _frame: FrameType | None) -> None:
        # shutdown() blocks until serve_forever returns, so it must run on another thread.
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
