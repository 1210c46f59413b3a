"""The InferenceServices read from the watch and the operator's own writes, not by a GET.

A reconcile of a service the watch delivered makes no read of it; what the operator wrote
(status, a cleared command) is read back at once, and a watch event older than it does not
undo it; a deleted service stays gone until a newer one of that name appears.
"""

from __future__ import annotations

import copy
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from fleetserve_operator.controller import service_cache
from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.controller.cached_kube import CachedKube
from fleetserve_operator.controller.child_watch import CHILD_KINDS
from fleetserve_operator.controller.events import EventPoster
from fleetserve_operator.controller.kube import ObjectRef
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.controller.service_watch import ServiceSink
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.records import Manifest, json_copy
from fleetserve_operator.testing import FakeKube, make_service

REF = ObjectRef(namespace="ns", name="demo", uid="uid-demo")


class VersionedKube(FakeKube):
    """`FakeKube` that counts reads of InferenceServices and versions its writes of them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()
        self.version = 10

    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        """Counted."""
        self.reads[name] += 1
        return super().get_inference_service(namespace, name)

    def apply_status(self, ref: ObjectRef, status: Manifest) -> Manifest | None:
        """Versioned."""
        self._bump(ref)
        return super().apply_status(ref, status)

    def remove_annotation(self, ref: ObjectRef, annotation: str) -> Manifest | None:
        """Versioned."""
        self._bump(ref)
        return super().remove_annotation(ref, annotation)

    def _bump(self, ref: ObjectRef) -> None:
        self.version += 1
        meta = self.objects[("InferenceService", ref.namespace, ref.name)]["metadata"]
        meta["resourceVersion"] = str(self.version)


def _service(version: int, **meta: Any) -> Manifest:
    body = make_service()
    body["metadata"].update(resourceVersion=str(version), **meta)
    return body


def _kube(services: ServiceCache) -> tuple[VersionedKube, CachedKube]:
    api, cache = VersionedKube(), ChildCache()
    for kind in CHILD_KINDS:
        cache.replace(kind.kind, kind.api_version, "ns", [])
    return api, CachedKube(api, cache, EventPoster(api.post_event, capacity=100), services)


def test_a_service_the_watch_delivered_is_read_without_a_request() -> None:
    services = ServiceCache()
    api, kube = _kube(services)
    api.add_service(_service(10))
    services.store(_service(10))
    assert kube.get_inference_service("ns", "demo") == _service(10)
    assert api.reads["demo"] == 0
    api.add_service(_service(3, name="unseen"))
    assert kube.get_inference_service("ns", "unseen") is not None
    assert kube.get_inference_service("ns", "unseen") is not None
    assert api.reads["unseen"] == 1, "read from the API once, then known"


def test_a_service_stored_is_copied_unless_its_caller_gives_it_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A status write's answer, decoded for the cache, is kept as it is: no copy."""
    copies: list[int] = []

    def counted(obj: Manifest) -> Manifest:
        copies.append(1)
        return json_copy(obj)

    monkeypatch.setattr(service_cache, "json_copy", counted)
    services = ServiceCache()
    mine = _service(10)
    services.store(mine)
    mine["metadata"]["labels"] = {"edited": "after"}
    assert copies == [1]
    assert "labels" not in services.get("ns", "demo")["metadata"]  # type: ignore[index]
    api, kube = _kube(services)
    api.add_service(_service(11))
    copies.clear()
    kube.apply_status(REF, {"phase": "Pending"})
    assert copies == [], "the answer is the cache's"
    assert services.get("ns", "demo")["status"] == {"phase": "Pending"}  # type: ignore[index]


def test_a_status_written_is_read_back_and_an_older_event_does_not_undo_it() -> None:
    services = ServiceCache()
    api, kube = _kube(services)
    api.add_service(_service(10))
    services.store(_service(10))
    kube.apply_status(REF, {"phase": "Pending"})
    services.store(_service(10))  # the watch's event of the state before the write, late
    read = kube.get_inference_service("ns", "demo")
    assert read is not None
    assert read["status"] == {"phase": "Pending"}
    read["status"]["phase"] = "Edited"  # a reader's copy
    assert kube.get_inference_service("ns", "demo")["status"] == {"phase": "Pending"}  # type: ignore[index]


def test_a_cleared_command_annotation_is_not_read_again() -> None:
    services = ServiceCache()
    api, kube = _kube(services)
    commanded = _service(10, annotations={"serving.fleetserve.io/promote": "true"})
    api.add_service(commanded)
    services.store(commanded)
    kube.remove_annotation(REF, "serving.fleetserve.io/promote")
    read = kube.get_inference_service("ns", "demo")
    assert read is not None
    assert read["metadata"]["annotations"] == {}


def test_a_deleted_service_stays_gone_until_a_newer_one_of_its_name_appears() -> None:
    services = ServiceCache()
    services.store(_service(10))
    services.discard(_service(12))
    services.store(_service(11))  # a write answered before the deletion, stored after it
    assert services.knows("ns", "demo")
    assert services.get("ns", "demo") is None
    services.store(_service(13, uid="uid-new"))
    assert services.get("ns", "demo") == _service(13, uid="uid-new")


def test_the_watchs_events_fill_the_cache_and_a_deletion_empties_it() -> None:
    services = ServiceCache()
    queued: list[tuple[str, str]] = []
    queue = SimpleNamespace(
        create=queued.append, change=queued.append, resume=queued.append, gone=queued.append
    )
    sink = ServiceSink(services, queue, "ns")
    sink.changed(_service(10))
    assert services.get("ns", "demo") == _service(10)
    sink.deleted(_service(11))
    assert services.knows("ns", "demo")
    assert services.get("ns", "demo") is None
    assert queued == [("ns", "demo"), ("ns", "demo")], "created, then gone"


def test_a_reconciled_service_is_not_read_again_and_an_unchanged_resync_writes_nothing() -> None:
    services = ServiceCache()
    api, kube = _kube(services)
    api.add_service(_service(10))
    services.store(_service(10))
    sync = Sync(kube, metrics=OperatorMetrics())
    sync.run_by_name("ns", "demo", trigger="create")
    written = copy.deepcopy(api.writes)
    assert ("status", "InferenceService", "demo") in written
    sync.run_by_name("ns", "demo", trigger="resync")
    assert api.writes == written, "the resync found everything as written"
    assert api.reads["demo"] == 0
