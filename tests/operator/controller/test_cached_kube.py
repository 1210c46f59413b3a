"""CachedKube: children and pods read from the cache once listed, writes cached, Events queued."""

from __future__ import annotations

import threading

from fleetserve_operator import naming
from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.controller.cached_kube import CachedKube
from fleetserve_operator.controller.child_watch import CHILD_KINDS
from fleetserve_operator.controller.events import EventPoster
from fleetserve_operator.controller.kube import ObjectRef
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.records import EventNote, Manifest, json_copy
from fleetserve_operator.testing import FakeKube

REF = ObjectRef(namespace="ns", name="demo", uid="u")


def _deployment(name: str) -> Manifest:
    labels = {naming.MANAGED_BY_LABEL: naming.MANAGER, naming.INSTANCE_LABEL: "demo"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "spec": {"replicas": 1},
    }


def _synced(cache: ChildCache) -> None:
    for kind in CHILD_KINDS:
        cache.replace(kind.kind, kind.api_version, "ns", [])


def test_reads_go_to_the_api_until_the_cache_is_listed_then_to_the_cache() -> None:
    api, cache = FakeKube(), ChildCache()
    kube = CachedKube(api, cache, EventPoster(api.post_event, capacity=10), ServiceCache())
    api.create(_deployment("demo-stable"))
    assert [c["metadata"]["name"] for c in kube.list_children("ns", "demo")] == ["demo-stable"]
    _synced(cache)
    assert kube.list_children("ns", "demo") == []  # the cache's word, not the API's


def test_a_write_is_read_back_from_the_cache_before_any_watch_event() -> None:
    api, cache = FakeKube(), ChildCache()
    kube = CachedKube(api, cache, EventPoster(api.post_event, capacity=10), ServiceCache())
    _synced(cache)
    created = kube.create(_deployment("demo-stable"))
    assert kube.list_children("ns", "demo") == [created]
    kube.list_children("ns", "demo")[0]["spec"]["replicas"] = 9  # a reader's copy
    assert kube.list_children("ns", "demo")[0]["spec"]["replicas"] == 1
    kube.delete(created)
    assert kube.list_children("ns", "demo") == []


def test_events_are_posted_in_order_by_their_own_thread_and_drained_on_close() -> None:
    posted: list[str] = []
    release = threading.Event()

    def slow_post(ref: ObjectRef, note: EventNote) -> None:
        release.wait(5.0)
        posted.append(note.reason)

    poster = EventPoster(slow_post, capacity=10)
    for reason in ("Created", "Updated", "Deleted"):
        poster.post(REF, EventNote("Normal", reason, reason))  # returns while the API waits
    assert posted == []
    release.set()
    poster.close(timeout_s=5.0)
    assert posted == ["Created", "Updated", "Deleted"]


def test_an_event_past_the_queues_capacity_is_dropped_not_waited_for() -> None:
    release = threading.Event()
    posted: list[str] = []

    def blocked_post(ref: ObjectRef, note: EventNote) -> None:
        release.wait(5.0)
        posted.append(note.reason)

    poster = EventPoster(blocked_post, capacity=1)
    for index in range(5):
        poster.post(REF, EventNote("Normal", f"R{index}", ""))
    release.set()
    poster.close(timeout_s=5.0)
    assert 1 <= len(posted) < 5


def test_a_json_copy_shares_nothing_a_reader_could_edit() -> None:
    original = {"spec": {"ports": [{"port": 80}], "labels": {"a": "b"}}, "n": 1}
    copied = json_copy(original)
    assert copied == original
    copied["spec"]["ports"][0]["port"] = 81
    copied["spec"]["labels"]["a"] = "c"
    assert original == {"spec": {"ports": [{"port": 80}], "labels": {"a": "b"}}, "n": 1}
