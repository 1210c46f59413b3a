"""The operator queries only the Prometheus URLs its configuration allows.

Two loopback HTTP servers stand in for Prometheus: one the operator's allowlist names, one it
does not. An InferenceService naming the second is reported invalid when its spec is parsed,
naming the field, though nothing would query it yet (no memory budget, no rollout): no child
is created and that server never sees a request. One naming the first is queried (its
memory-budget check).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetserve_e2e import KubeClient
from fleetserve_e2e.operator_process import OperatorProcess, condition, fsvc_path
from fleetserve_e2e.operator_testing import children, synthetic_service
from fleetserve_e2e.waiting import wait_until

EMPTY_VECTOR = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
FIELD = "spec.rollout.analysis.prometheusUrl"


class _Prometheus:
    """A loopback server answering every GET with an empty instant-query result."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        recorded = self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                recorded.append(self.path)
                body = EMPTY_VECTOR.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))

    def __enter__(self) -> _Prometheus:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()


@pytest.fixture
def allowed() -> Iterator[_Prometheus]:
    """The Prometheus the operator's allowlist names."""
    with _Prometheus() as server:
        yield server


@pytest.fixture
def forbidden() -> Iterator[_Prometheus]:
    """A Prometheus outside the allowlist."""
    with _Prometheus() as server:
        yield server


def _service(name: str, url: str, **sections: Any) -> dict[str, Any]:
    """A service naming `url` for its analysis."""
    return synthetic_service(name, rollout={"analysis": {"prometheusUrl": url}}, **sections)


def test_only_allowlisted_prometheus_urls_are_queried(
    kube: KubeClient,
    namespace: str,
    start_operator: Any,
    allowed: _Prometheus,
    forbidden: _Prometheus,
) -> None:
    """Outside the list: InvalidSpec at once, naming the field, no child, no request.

    Inside: queried, as its memory budget makes every reconcile do.
    """
    operator: OperatorProcess = start_operator(
        {"FLEETSERVE_ALLOWED_PROMETHEUS_URLS": json.dumps([allowed.url])}
    )
    kube.create(fsvc_path(namespace), _service("outside", forbidden.url))
    kube.create(fsvc_path(namespace), _service("inside", allowed.url, memory={"budget": "1Gi"}))

    def degraded() -> dict[str, Any] | None:
        found = condition(kube.get(fsvc_path(namespace, "outside")).get("status", {}), "Degraded")
        return found if found["status"] == "True" else None

    reported = wait_until(degraded, timeout_s=60.0, what="outside reported Degraded")
    assert reported["reason"] == "InvalidSpec"
    assert FIELD in reported["message"]
    assert children(kube, namespace, "outside") == {}
    wait_until(lambda: allowed.paths, timeout_s=60.0, what="the allowed Prometheus queried")
    assert all(path.startswith("/api/v1/query?") for path in allowed.paths)
    assert forbidden.paths == []
    assert operator.process.is_running()
