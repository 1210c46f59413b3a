"""The operator's own watch of the InferenceServices: a warm cache, and spec changes queued.

`ServiceSink` is checked against a real `ServiceCache`; the wiring of `__main__` against a
loopback server speaking the list and watch protocol, through the real `kubernetes` client.
"""

from __future__ import annotations

import json
import threading
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import kubernetes
import pytest

from fleetserve_operator import __main__ as entry
from fleetserve_operator import naming
from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.controller.kube import KubeApi
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.controller.service_watch import ServiceSink
from fleetserve_operator.controller.settings import OperatorConfig
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.controller.workqueue import Lane
from fleetserve_operator.records import Manifest
from fleetserve_operator.testing import FakeKube, QuietHandler, serve_http

Key = tuple[str, str]


def _service(name: str, *, generation: int, rv: str, phase: str = "") -> Manifest:
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {
            "name": name, "namespace": "ns", "generation": generation, "resourceVersion": rv,
        },
        "spec": {"batching": {"maxBatchSize": generation}},
        "status": {"phase": phase} if phase else {},
    }  # fmt: skip


def _sink() -> tuple[ServiceCache, list[Key], ServiceSink]:
    services, changed = ServiceCache(), []
    return services, changed, ServiceSink(services, changed.append, "ns")


def test_a_new_generation_of_a_known_service_is_a_change_and_a_status_write_is_not() -> None:
    services, changed, sink = _sink()
    sink.listed([_service("a", generation=1, rv="10")], "10")
    sink.changed(_service("a", generation=1, rv="11", phase="Ready"))
    assert changed == []
    sink.changed(_service("a", generation=2, rv="12", phase="Ready"))
    assert changed == [("ns", "a")]
    assert services.generation("ns", "a") == 2


def test_a_service_first_seen_is_left_to_the_create_handler() -> None:
    _, changed, sink = _sink()
    sink.listed([], "10")
    sink.changed(_service("new", generation=1, rv="11"))
    assert changed == []


def test_a_change_kopf_already_stored_is_not_queued_twice() -> None:
    """The event handler of kopf may store the new generation first; its update handler follows."""
    services, changed, sink = _sink()
    sink.listed([_service("a", generation=1, rv="10")], "10")
    services.store(_service("a", generation=2, rv="12"))
    sink.changed(_service("a", generation=2, rv="12"))
    assert changed == []


def test_a_listing_tombstones_what_was_deleted_while_no_watch_ran() -> None:
    services, _, sink = _sink()
    sink.listed([_service("a", generation=1, rv="10"), _service("b", generation=1, rv="10")], "10")
    sink.listed([_service("a", generation=1, rv="10")], "30")
    assert services.get("ns", "b") is None
    assert services.knows("ns", "b")  # a reader must not GET it back from a stale answer
    services.store(_service("b", generation=1, rv="20"))  # a late answer from before
    assert services.get("ns", "b") is None
    assert services.get("ns", "a") is not None


def test_a_listing_of_one_namespace_leaves_the_others_alone() -> None:
    services, _, sink = _sink()
    other = {**_service("z", generation=1, rv="5")}
    other["metadata"] = {**other["metadata"], "namespace": "other"}
    services.store(other)
    sink.listed([], "10")
    assert services.get("other", "z") is not None


class _ApiServer(QuietHandler):
    """Two InferenceServices, then a status write of one and a spec change of the other.

    Every child kind: an empty list and a watch held open. (Events reach the client when
    the server ends a watch: this server does not chunk its answers.)
    """

    requests: ClassVar[list[tuple[str, dict[str, list[str]]]]] = []
    release: ClassVar[threading.Event] = threading.Event()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        type(self).requests.append((url.path, query))
        services = url.path.endswith(f"/{naming.PLURAL}")
        if "watch" not in query:
            items = [_service(n, generation=1, rv="10") for n in "ab"] if services else []
            body = json.dumps({"metadata": {"resourceVersion": "10"}, "items": items}).encode()
            self.reply(200, body, {"Content-Type": "application/json"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if services and query["resourceVersion"] == ["10"]:
            for obj in (
                _service("a", generation=1, rv="11", phase="Ready"),
                _service("b", generation=2, rv="12"),
            ):
                self.wfile.write(json.dumps({"type": "MODIFIED", "object": obj}).encode() + b"\n")
            return  # the server ends this watch; the next, from "12", is held open
        type(self).release.wait(timeout=20.0)  # held open until the test ends


@pytest.mark.timeout(60)
def test_the_operator_queues_a_spec_change_its_service_watch_saw_in_the_change_lane() -> None:
    metrics = OperatorMetrics()
    services = ServiceCache()
    with serve_http(_ApiServer) as url:
        client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url))
        workers, watches = entry._queue_and_watches(
            OperatorConfig(namespaces=["ns"]),
            metrics,
            Sync(FakeKube(), metrics=metrics),
            KubeApi(client),
            (ChildCache(), services),
        )
        watches.start()
        try:
            taken = workers.queue.take(timeout_s=20.0)
            assert taken == (("ns", "b"), Lane.CHANGE)
            assert workers.queue.take(timeout_s=0.5) is None, "the status write queued nothing"
        finally:
            watches.stop()
            _ApiServer.release.set()
    assert services.generation("ns", "b") == 2
    assert services.get("ns", "a") is not None
    watched = [q for path, q in _ApiServer.requests if path.endswith(f"/{naming.PLURAL}")]
    assert watched
    assert all("labelSelector" not in q for q in watched), "users' services carry no label"
