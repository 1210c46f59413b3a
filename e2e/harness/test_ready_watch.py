"""The bench's watch of ready objects, on the session's real API server (ConfigMaps stand in)."""

from __future__ import annotations

import time
from collections.abc import Iterator

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


def test_a_watch_that_fails_lists_again_so_a_change_it_missed_is_counted(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """410 Gone, say: the change made while no watch ran is in the next list."""
    path = namespaced("configmaps", namespace)
    kube.create(path, {"metadata": {"name": "one"}, "data": {"ready": "no"}})
    watch_calls: list[str] = []
    real_watch = kube.watch

    def failing_once(path: str, version: str, timeout_s: int = 60) -> Iterator[WatchEvent]:
        watch_calls.append(version)
        if len(watch_calls) == 1:
            kube.merge_patch(f"{path}/one", {"data": {"ready": "yes"}})
        if version == watch_calls[0]:  # expired: only a new list gives a version to watch from
            raise KubeApiError(410, "too old resource version", "Expired")
        return real_watch(path, version, timeout_s)

    monkeypatch.setattr(kube, "watch", failing_once)
    with ReadyWatch(kube, path, _is_ready) as watch:
        wait_until(lambda: watch.ready_count == 1, timeout_s=10, what="the missed change")
        assert len(watch_calls) >= 2
