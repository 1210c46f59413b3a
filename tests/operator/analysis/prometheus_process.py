"""A Prometheus stand-in run as its own process, so a test can SIGKILL or SIGSTOP it.

`python prometheus_process.py ANSWERS PORT_FILE` serves `GET /` (online) and the instant
query API on a free loopback port, which it writes to PORT_FILE once it listens. Every
query is answered from the JSON file ANSWERS, read afresh each time so the test can move
the counters between two looks: `{"series": {promql: [[labels, value], ...]}, "default":
value or null}`; a query not listed gets one unlabelled sample of `default`, or no series
when it is null. A stopped process keeps its listening socket: the kernel still accepts
connections, and nothing answers them, as with a frozen Prometheus.
"""

from __future__ import annotations

import json
import sys
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fleetserve_operator.testing import QuietHandler


def _result(answers: dict[str, Any], promql: str) -> list[dict[str, Any]]:
    listed = answers["series"].get(promql)
    if listed is None:
        default = answers.get("default")
        listed = [] if default is None else [[{}, default]]
    return [{"metric": labels, "value": [0, str(value)]} for labels, value in listed]


def main(answers_path: Path, port_path: Path) -> None:
    """Serve until killed."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # http.server's naming
            url = urlsplit(self.path)
            if url.path == "/":
                body = b"Prometheus"
            else:
                promql = parse_qs(url.query)["query"][0]
                answers = json.loads(answers_path.read_text(encoding="utf-8"))
                data = {"resultType": "vector", "result": _result(answers, promql)}
                body = json.dumps({"status": "success", "data": data}).encode()
            self.reply(200, body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    written = port_path.with_suffix(".tmp")
    written.write_text(str(server.server_address[1]), encoding="utf-8")
    written.rename(port_path)
    server.serve_forever()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
