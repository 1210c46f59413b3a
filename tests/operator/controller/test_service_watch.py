"""The operator's watch of the InferenceServices: a warm cache, and what each state is owed.

`ServiceSink` is checked against a real `ServiceCache`; the wiring of `__main__` against a
loopback server speaking the list and watch protocol, through the real `kubernetes` client.
"""

from __future__ import annotations

import json
import threading
import time
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


def _service(
    name: str, *, generation: int, rv: str, observed: int | None = None, phase: str = ""
) -> Manifest:
    status: dict[str, object] = {"phase": phase} if phase else {}
    if observed is not None:
        status["observedGeneration"] = observed
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {
            "name": name, "namespace": "ns", "generation": generation, "resourceVersion": rv,
        },
        "spec": {"batching": {"maxBatchSize": generation}},
        "status": status,
    }  # fmt: skip


class _Queue:
    """Records what the sink queued, as (what, name)."""

    def __init__(self) -> None:
        self.queued: list[tuple[str, str]] = []

    def create(self, key: Key) -> None:
        self.queued.append(("create", key[1]))

    def change(self, key: Key) -> None:
        self.queued.append(("change", key[1]))

    def resume(self, key: Key) -> None:
        self.queued.append(("resume", key[1]))

    def gone(self, key: Key) -> None:
        self.queued.append(("gone", key[1]))


def _sink() -> tuple[ServiceCache, _Queue, ServiceSink]:
    services, queue = ServiceCache(), _Queue()
    return services, queue, ServiceSink(services, queue, "ns")


def test_a_service_never_reconciled_is_a_create() -> None:
    _, queue, sink = _sink()
    sink.listed([], "10")
    sink.changed(_service("new", generation=1, rv="11"))
    assert queue.queued == [("create", "new")]


def test_a_new_generation_of_a_known_service_is_a_change_and_a_status_write_is_not() -> None:
    services, queue, sink = _sink()
    sink.listed([_service("a", generation=1, rv="10", observed=1)], "10")
    queue.queued.clear()
    sink.changed(_service("a", generation=1, rv="11", observed=1, phase="Ready"))
    assert queue.queued == []
    sink.changed(_service("a", generation=2, rv="12", observed=1, phase="Ready"))
    assert queue.queued == [("change", "a")]
    assert (services.get("ns", "a") or {})["metadata"]["generation"] == 2


def test_a_change_the_operators_own_write_stored_first_is_still_a_change() -> None:
    """A status write answered after the user's edit stores the new generation first.

    Its echo, and the edit's event, report the older generation as observed: still owed.
    """
    services, queue, sink = _sink()
    sink.listed([_service("a", generation=1, rv="10", observed=1)], "10")
    queue.queued.clear()
    services.store(_service("a", generation=2, rv="12", observed=1, phase="Ready"))
    sink.changed(_service("a", generation=2, rv="12", observed=1, phase="Ready"))
    assert queue.queued == [("change", "a")]
    sink.changed(_service("a", generation=2, rv="13", observed=2, phase="Ready"))
    assert queue.queued == [("change", "a")], "converged: its own echo is owed nothing"


def test_a_new_leaders_listing_resumes_what_is_up_to_date_and_queues_the_rest_as_changes() -> None:
    _, queue, sink = _sink()
    sink.listed(
        [
            _service("done", generation=3, rv="10", observed=3),
            _service("edited", generation=4, rv="10", observed=3),
            _service("new", generation=1, rv="10"),
        ],
        "10",
    )
    assert queue.queued == [("resume", "done"), ("change", "edited"), ("create", "new")]


def test_a_service_a_reconcile_read_before_the_listing_is_still_resumed() -> None:
    """A child listing's resync may read the service from the API server into the cache first."""
    services, queue, sink = _sink()
    services.store(_service("a", generation=1, rv="10", observed=1))
    sink.listed([_service("a", generation=1, rv="10", observed=1)], "10")
    assert queue.queued == [("resume", "a")]


def test_a_listing_after_a_lost_watch_queues_only_what_moved_on() -> None:
    _, queue, sink = _sink()
    sink.listed([_service("a", generation=1, rv="10", observed=1)], "10")
    sink.listed(
        [
            _service("a", generation=1, rv="20", observed=1, phase="Ready"),
            _service("b", generation=1, rv="20"),
        ],
        "20",
    )
    assert queue.queued == [("resume", "a"), ("create", "b")]


def test_a_deletion_and_a_service_a_listing_no_longer_names_are_dropped() -> None:
    _, queue, sink = _sink()
    sink.listed(
        [_service("a", generation=1, rv="10", observed=1), _service("b", generation=1, rv="10")],
        "10",
    )
    queue.queued.clear()
    sink.deleted(_service("a", generation=1, rv="11", observed=1))
    sink.listed([], "20")
    assert queue.queued == [("gone", "a"), ("gone", "b")]


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
    services, queue, sink = _sink()
    other = {**_service("z", generation=1, rv="5")}
    other["metadata"] = {**other["metadata"], "namespace": "other"}
    services.store(other)
    sink.listed([], "10")
    assert services.get("other", "z") is not None
    assert queue.queued == []


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
            listed = [_service(n, generation=1, rv="10", observed=1) for n in "ab"]
            items = listed if services else []
            body = json.dumps({"metadata": {"resourceVersion": "10"}, "items": items}).encode()
            self.reply(200, body, {"Content-Type": "application/json"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if services and query["resourceVersion"] == ["10"]:
            for obj in (
                _service("a", generation=1, rv="11", observed=1, phase="Ready"),
                _service("b", generation=2, rv="12", observed=1),
            ):
                self.wfile.write(json.dumps({"type": "MODIFIED", "object": obj}).encode() + b"\n")
            return  # the server ends this watch; the next, from "12", is held open
        type(self).release.wait(timeout=20.0)  # held open until the test ends


@pytest.mark.timeout(60)
def test_the_operator_resumes_a_listing_and_queues_a_spec_change_in_the_change_lane() -> None:
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
            deadline = time.monotonic() + 20.0
            while workers.queue.depth(Lane.CHANGE) == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            taken = workers.queue.take(timeout_s=0)
            assert taken == (("ns", "b"), Lane.CHANGE)
            workers.queue.done(("ns", "b"))
            # The listing resumed both; the status write of "a" queued nothing more.
            assert workers.queue.take(timeout_s=0.5) == (("ns", "a"), Lane.RESYNC)
            workers.queue.done(("ns", "a"))
            assert workers.queue.take(timeout_s=0.5) is None
        finally:
            watches.stop()
            _ApiServer.release.set()
    assert (services.get("ns", "b") or {})["metadata"]["generation"] == 2
    assert services.get("ns", "a") is not None
    watched = [q for path, q in _ApiServer.requests if path.endswith(f"/{naming.PLURAL}")]
    assert watched
    assert all("labelSelector" not in q for q in watched), "users' services carry no label"
