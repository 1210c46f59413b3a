"""Child watches: an event reduced to its InferenceService's key, over real HTTP.

`owner_key` is pure. `ChildWatches` runs against a loopback server speaking the API
server's list and watch protocol (JSON lines, bookmarks, 410 Gone, a plain-text 404 for a
kind whose CRD is absent), through the real `kubernetes` client.
"""

from __future__ import annotations

import errno
import json
import threading
from typing import ClassVar, cast
from urllib.parse import parse_qs, urlsplit

import kopf
import kubernetes
import pytest
import urllib3

from fleetserve_operator import __main__ as entry
from fleetserve_operator import naming
from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.controller.child_watch import (
    CHILD_KINDS,
    ChildWatches,
    _ChildSink,
    owner_key,
)
from fleetserve_operator.controller.handlers import QueueWorkers, Resyncer, register
from fleetserve_operator.controller.kube import KubeApi
from fleetserve_operator.controller.list_watch import ListWatch
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.controller.settings import OperatorConfig
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.controller.workqueue import Lane
from fleetserve_operator.observe import STATUS_READINGS
from fleetserve_operator.records import Manifest
from fleetserve_operator.testing import FakeKube, QuietHandler, serve_http

OURS = {naming.MANAGED_BY_LABEL: naming.MANAGER}


def _child(name: str, owner: str | None, *, kind: str = naming.KIND, rv: str = "1") -> Manifest:
    refs = [
        {"apiVersion": naming.API_VERSION, "kind": kind, "name": owner, "controller": True,
         "uid": "u"},
    ] if owner else []  # fmt: skip
    return {
        "metadata": {
            "name": name, "namespace": "ns", "resourceVersion": rv,
            "labels": {**OURS, naming.INSTANCE_LABEL: owner} if owner else OURS,
            "ownerReferences": refs,
        }
    }  # fmt: skip


def test_a_child_maps_to_its_controlling_inference_service() -> None:
    assert owner_key("Deployment", _child("demo-stable", "demo")) == ("ns", "demo")


def test_an_object_owned_by_another_kind_or_not_controlled_is_ignored() -> None:
    assert owner_key("Deployment", _child("x", "demo", kind="Application")) is None
    assert owner_key("Service", _child("x", None)) is None
    foreign = _child("x", "demo")
    foreign["metadata"]["ownerReferences"][0]["controller"] = False
    assert owner_key("Service", foreign) is None
    other_group = _child("x", "demo")
    other_group["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1"
    assert owner_key("Service", other_group) is None


def test_a_pod_maps_by_its_instance_label_only_when_the_operator_manages_it() -> None:
    labels = {**OURS, naming.INSTANCE_LABEL: "demo"}
    pod = {"metadata": {"name": "demo-stable-x", "namespace": "ns", "labels": labels}}
    assert owner_key("Pod", pod) == ("ns", "demo")
    pod["metadata"]["labels"] = {naming.INSTANCE_LABEL: "demo"}
    assert owner_key("Pod", pod) is None


def test_a_status_no_reconcile_reads_queues_nothing_a_deployments_or_pods_does() -> None:
    """`observe` reads the status of Deployments and pods only, and of no other child.

    Of theirs, only what it reads: a Deployment's ready count, a pod's crash, not a
    Deployment's observed generation or a pod's readiness.
    """
    keys: list[tuple[str, str]] = []
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host="http://127.0.0.1:9"))
    watches = ChildWatches(
        client, namespaces=["ns"], readings=STATUS_READINGS, on_owner=keys.append
    )
    unread = {"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}]}
    crashed = {"name": "runtime", "restartCount": 1, "state": {"waiting": {"reason": "Error"}}}
    read = {**unread, "readyReplicas": 1, "containerStatuses": [crashed]}
    queued = {}

    def child(rv: str, status: Manifest | None = None) -> Manifest:
        return {**_child("a-stable", "a", rv=rv), "spec": {}, "status": status or {}}

    for kind in CHILD_KINDS:
        sink = _ChildSink(watches, kind, "ns")
        sink.listed([child("1")], "1")
        keys.clear()
        sink.changed(child("2", unread))
        assert keys == [], kind.kind
        sink.changed(child("3", read))
        queued[kind.kind] = keys == [("ns", "a")]
    assert {kind for kind, news in queued.items() if news} == {"Deployment", "Pod"}


class _ApiServer(QuietHandler):
    """Deployments: list, a watch with events and a bookmark, 410 Gone, re-list, an open watch.

    HTTPRoutes: a plain-text 404, as for a CRD that is not installed.
    """

    requests: ClassVar[list[tuple[str, dict[str, list[str]]]]] = []
    release: ClassVar[threading.Event] = threading.Event()
    listed: ClassVar[int] = 0

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        type(self).requests.append((url.path, query))
        if url.path.endswith("/httproutes"):
            self.reply(404, b"404 page not found", {"Content-Type": "text/plain"})
        elif "watch" not in query:
            type(self).listed += 1
            owner = "a" if self.listed == 1 else "c"
            items = [_child(f"{owner}-stable", owner)]
            rv = "10" if self.listed == 1 else "20"
            self._json({"metadata": {"resourceVersion": rv}, "items": items})
        else:
            self._watch(query["resourceVersion"][0])

    def _watch(self, version: str) -> None:
        events: list[Manifest] = []
        if version == "10":
            events = [
                {"type": "ADDED", "object": _child("b-stable", "b", rv="11")},
                {"type": "MODIFIED", "object": _child("foreign", None, rv="12")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}},
            ]
        elif version == "13":
            events = [{"type": "ERROR", "object": {"kind": "Status", "code": 410}}]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        for event in events:
            self.wfile.write(json.dumps(event).encode() + b"\n")
        self.wfile.flush()
        if version == "20":
            type(self).release.wait(timeout=20.0)  # held open until the test ends

    def _json(self, body: Manifest) -> None:
        self.reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})


def _paths(server: type[_ApiServer], suffix: str) -> list[dict[str, list[str]]]:
    return [query for path, query in server.requests if path.endswith(suffix)]


@pytest.mark.timeout(60)
def test_watches_resume_relist_on_gone_and_leave_an_absent_kind_alone() -> None:
    kinds = [k for k in CHILD_KINDS if k.kind in ("Deployment", "HTTPRoute")]
    keys: list[tuple[str, tuple[str, str]]] = []
    seen_c = threading.Event()

    def on_owner(key: tuple[str, str]) -> None:
        keys.append(("event", key))

    def on_listed(key: tuple[str, str]) -> None:
        keys.append(("listed", key))
        if key == ("ns", "c"):
            seen_c.set()

    cache = ChildCache()
    with serve_http(_ApiServer) as url:
        client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url))
        watches = ChildWatches(
            client, namespaces=["ns"], readings=STATUS_READINGS, on_owner=on_owner,
            on_listed=on_listed, kinds=kinds,
            retry_s=0.1, absent_retry_s=3600.0, cache=cache,
        )  # fmt: skip
        watches.start()
        try:
            assert seen_c.wait(timeout=20.0)
            for _ in range(200):
                if len(_paths(_ApiServer, "/deployments")) == 5:
                    break
                threading.Event().wait(0.05)
        finally:
            watches.stop()
            _ApiServer.release.set()
    deployments = _paths(_ApiServer, "/deployments")
    assert all(q["labelSelector"] == [f"{naming.MANAGED_BY_LABEL}={naming.MANAGER}"]
               for q in deployments)  # fmt: skip
    versions = [q.get("resourceVersion", ["list"])[0] for q in deployments]
    # Every list queues its owners, the re-list after 410 too (events may have been lost),
    # as listed (a resync's worth of work); the bookmark's version is resumed from; the
    # foreign object queues nothing.
    assert versions == ["list", "10", "13", "list", "20"]
    assert keys == [("listed", ("ns", "a")), ("event", ("ns", "b")), ("listed", ("ns", "c"))]
    assert len(_paths(_ApiServer, "/httproutes")) == 1
    assert _paths(_ApiServer, "/httproutes")[0].get("watch") is None
    # The cache holds the last listing (what the first one and its events saw is gone), and
    # the absent kind counts as listed: nothing of it exists.
    assert cache.synced("ns", ("Deployment", "HTTPRoute"))
    owned = {o: cache.owned("ns", o, ("Deployment",)) for o in "abc"}
    assert [len(owned[o]) for o in "abc"] == [0, 0, 1]
    assert owned["c"][0]["kind"] == "Deployment"


def test_the_operator_queues_a_listings_owners_as_resyncs_and_an_events_owner_as_an_event() -> None:
    """A new leader's first lists name every service: they must not take every worker."""
    metrics = OperatorMetrics()
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host="http://127.0.0.1:9"))
    workers, watches = entry._queue_and_watches(
        OperatorConfig(),
        metrics,
        Sync(FakeKube(), metrics=metrics),
        KubeApi(client),
        (ChildCache(), ServiceCache()),
    )
    assert watches.readings is STATUS_READINGS, "a pod's crash queues its service"
    watches.notify("Deployment", _child("a-stable", "a"), listed=True)
    watches.notify("Deployment", _child("b-stable", "b"))
    assert workers.queue.depth(Lane.RESYNC) == 1
    assert workers.queue.take(timeout_s=0) == (("ns", "a"), Lane.RESYNC)
    assert workers.queue.take(timeout_s=5.0) == (("ns", "b"), Lane.EVENT)


def test_kopf_starts_the_queue_before_the_watches() -> None:
    """So that no event of the first listings waits for a worker."""
    sync = Sync(FakeKube(), metrics=OperatorMetrics())
    workers = QueueWorkers(sync, OperatorMetrics(), workers=1)
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host="http://127.0.0.1:9"))
    watches = ChildWatches(
        client, namespaces=["ns"], readings=STATUS_READINGS, on_owner=workers.add
    )
    registry = kopf.OperatorRegistry()
    register(registry, sync, Resyncer(sync, ServiceCache(), interval_s=60),
             children=(workers, watches))  # fmt: skip
    # kopf offers no public lookup of registered handlers; its own tests read these.
    startup = [str(h.id) for h in registry._activities.get_all_handlers()
               if h.activity == "startup"]  # fmt: skip
    assert startup.index("queue-start") < startup.index("watch-start")


class _ClosedResponse:
    """A watch response its thread closed just before the stop reached it."""

    def shutdown(self) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")


def test_stopping_a_watch_whose_response_was_just_closed_is_quiet() -> None:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host="http://127.0.0.1:9"))
    watches = ChildWatches(
        client, namespaces=["ns"], readings=STATUS_READINGS, on_owner=lambda key: None
    )
    kind = CHILD_KINDS[0]
    watch = ListWatch(watches.settings, kind.path("ns"), _ChildSink(watches, kind, "ns"))
    watch._response = cast(urllib3.BaseHTTPResponse, _ClosedResponse())
    watch.interrupt()
