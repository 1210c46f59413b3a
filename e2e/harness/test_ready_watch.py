"""The bench's watch of ready objects, on the session's real API server (ConfigMaps stand in)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import pytest

from fleetserve_e2e import KubeClient
from fleetserve_e2e.kubeapi import JsonObject, KubeApiError, WatchEvent, namespaced
from fleetserve_e2e.ready_watch import ReadyWatch
from fleetserve_e2e.waiting import wait_until


def _is_ready(item: JsonObject) -> bool:
    return bool((item.get("data") or {}).get("ready") == "yes")


def test_the_count_follows_creates_changes_and_deletes_and_says_when_all_were_ready(
    kube: KubeClient, namespace: str
) -> None:
    """Listed first, then watched: every change moves the count, the first time stays."""
    path = namespaced("configmaps", namespace)
    kube.create(path, {"metadata": {"name": "listed"}, "data": {"ready": "yes"}})
    with ReadyWatch(kube, path, _is_ready) as watch:
        assert watch.ready_count == 1, "what the first list found"
        assert watch.all_ready_at(2) is None
        kube.create(path, {"metadata": {"name": "late"}, "data": {"ready": "no"}})
        before = time.monotonic()
        kube.merge_patch(f"{path}/late", {"data": {"ready": "yes"}})
        at = wait_until(lambda: watch.all_ready_at(2), timeout_s=10, what="both ready")
        assert at >= before, "when the watch saw the second one become ready"
        kube.merge_patch(f"{path}/listed", {"data": {"ready": "no"}})
        wait_until(lambda: watch.ready_count == 1, timeout_s=10, what="one unready again")
        kube.delete(f"{path}/late")
        wait_until(lambda: watch.ready_count == 0, timeout_s=10, what="the ready one deleted")
        assert watch.all_ready_at(2) == at, "the first time stands"


@pytest.mark.parametrize("how", ["410 Gone", "an ERROR event after a bookmark"])
def test_a_watch_that_fails_lists_again_so_a_change_it_missed_is_counted(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The change made while no watch ran is in the next list."""
    path = namespaced("configmaps", namespace)
    kube.create(path, {"metadata": {"name": "one"}, "data": {"ready": "no"}})
    watch_calls: list[str] = []
    real_watch = kube.watch
    bookmark = WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "1"}})
    expired = WatchEvent("ERROR", {"code": 410, "message": "too old resource version"})

    def failing(asked: str, version: str, timeout_s: int = 60) -> Iterator[WatchEvent]:
        if asked != path:  # the session's client serves other threads too
            return real_watch(asked, version, timeout_s)
        watch_calls.append(version)
        if len(watch_calls) == 1:
            kube.merge_patch(f"{path}/one", {"data": {"ready": "yes"}})
        if version not in (watch_calls[0], bookmark.object["metadata"]["resourceVersion"]):
            return real_watch(path, version, timeout_s)
        # Expired: only a new list gives a version to watch from.
        if how == "410 Gone":
            raise KubeApiError(410, "too old resource version", "Expired")
        return iter([bookmark, expired])

    monkeypatch.setattr(kube, "watch", failing)
    with ReadyWatch(kube, path, _is_ready) as watch:
        wait_until(lambda: watch.ready_count == 1, timeout_s=10, what="the missed change")
        assert watch.failure is None
    assert len(watch_calls) >= 2


def test_a_first_list_refused_while_a_new_kinds_storage_starts_is_tried_again(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after its CRD is installed, a kind answers 429 for a moment."""
    path = namespaced("configmaps", namespace)
    kube.create(path, {"metadata": {"name": "one"}, "data": {"ready": "yes"}})
    lists: list[str] = []
    real_get = kube.get

    def refused_once(asked: str, params: Mapping[str, str] | None = None) -> JsonObject:
        if asked == path:  # the session's client serves other threads too
            lists.append(asked)
            if len(lists) == 1:
                raise KubeApiError(429, "storage is (re)initializing", "TooManyRequests")
        return real_get(asked, params)

    monkeypatch.setattr(kube, "get", refused_once)
    with ReadyWatch(kube, path, _is_ready) as watch:
        assert watch.ready_count == 1, "counted from the list tried again"
    # Its watch may list again later (a watch cache behind the list's version answers with
    # an error): at least the refused list and the one after it.
    assert len(lists) >= 2
