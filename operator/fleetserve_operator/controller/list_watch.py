"""One collection listed, then watched from the list's resourceVersion, on a thread of its own.

What a watch saw goes to a `WatchSink`: the listing, each added or modified object, each
deletion, and the moments the view stops being complete (a failure, a 410) or the kind turns
out not to be served (404: its CRD is not installed). The sink decides what that means: the
child watches keep a cache and queue owners (`child_watch`), the InferenceServices' watch
keeps the services' cache and queues spec changes (`service_watch`).

A watch resumes from the last resourceVersion it saw (bookmarks included) when the server
ends it, and re-lists when that version is too old (410 Gone). A kind that is absent is tried
again after `absent_retry_s`, so its watch starts once the CRD appears; other failures are
logged and retried after `retry_s`. Requests go by path through the client's `ApiClient`, as
in `kube`, and events are parsed as plain JSON: no model objects.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Protocol

import kubernetes
import urllib3

from fleetserve_operator.records import Manifest

__all__ = ["ListWatch", "WatchSettings", "WatchSink"]

logger = logging.getLogger(__name__)


class WatchSink(Protocol):
    """What one list-watch tells; called from its thread."""

    def listed(self, items: list[Manifest], version: str) -> None:
        """A complete listing, at resourceVersion `version`."""

    def changed(self, obj: Manifest) -> None:
        """An object was added or modified."""

    def deleted(self, obj: Manifest) -> None:
        """An object was deleted (its last state)."""

    def lost(self) -> None:
        """The watch failed or its version expired: events may be missing until the re-list."""

    def absent(self) -> None:
        """The kind is not served (404): nothing of it exists."""


@dataclass(frozen=True)
class WatchSettings:
    """What every list-watch of the operator shares."""

    client: kubernetes.client.ApiClient
    stopping: threading.Event
    watch_timeout_s: int = 300
    request_timeout_s: float = 30.0
    retry_s: float = 5.0
    absent_retry_s: float = 60.0


class _Gone(Exception):
    """The resourceVersion to resume from is too old (410): re-list."""


class _Absent(Exception):
    """The kind is not served (its CRD is not installed)."""


class _Failed(Exception):
    """Any other failed request; retried after a pause."""


class ListWatch:
    """The collection at `path` (label-selected by `selector`), told to `sink`."""

    def __init__(
        self, settings: WatchSettings, path: str, sink: WatchSink, *, selector: str | None = None
    ) -> None:
        self._settings = settings
        self._path = path
        self._sink = sink
        self._selector = [] if selector is None else [("labelSelector", selector)]
        self._response: urllib3.BaseHTTPResponse | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"watch-{path.rsplit('/', 3)[-1]}", daemon=True
        )

    def interrupt(self) -> None:
        """Shut the open watch's socket, so its thread sees the stop at once."""
        response = self._response
        if response is None:
            return
        try:
            response.shutdown()
        except OSError:
            # The watch thread closed this response between the read above and the shutdown
            # (EBADF): its socket is already gone, which is all a stop asks of it.
            logger.debug("watch %s was already closed when stopped", self._path)

    def _run(self) -> None:
        settings = self._settings
        version: str | None = None
        while not settings.stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
            except _Gone:
                version = None
                self._sink.lost()
            except _Absent:
                version = None
                self._sink.absent()
                if settings.stopping.wait(settings.absent_retry_s):
                    return
            except _Failed as exc:
                self._sink.lost()
                if settings.stopping.is_set():
                    return
                logger.warning("watch of %s failed, retried: %s", self._path, exc)
                version = None
                if settings.stopping.wait(settings.retry_s):
                    return

    def _request(
        self, query: list[tuple[str, str]], read_timeout_s: float
    ) -> urllib3.BaseHTTPResponse:
        client = self._settings.client
        request = client.param_serialize(
            "GET", self._path, query_params=[*self._selector, *query],
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
        )  # fmt: skip
        try:
            response: urllib3.BaseHTTPResponse = client.call_api(
                *request, _request_timeout=(10.0, read_timeout_s)
            ).response
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Failed(f"GET {self._path}: {exc}") from exc
        if response.status == 404:
            response.read()
            raise _Absent(self._path)
        if response.status == 410:
            response.read()
            raise _Gone(self._path)
        if not 200 <= response.status < 300:
            raise _Failed(f"GET {self._path}: {response.status} {response.read()[:200]!r}")
        return response

    def _list(self) -> str:
        """List the collection into the sink; returns the list's resourceVersion."""
        response = self._request([], self._settings.request_timeout_s)
        try:
            listed: Manifest = json.loads(response.read())
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _Failed(f"list {self._path}: {exc}") from exc
        version = str(listed["metadata"]["resourceVersion"])
        self._sink.listed(listed.get("items") or [], version)
        return version

    def _watch(self, version: str) -> str:
        """Follow events from `version` until the server ends the watch; the last version."""
        timeout_s = self._settings.watch_timeout_s
        query = [
            ("watch", "true"), ("resourceVersion", version), ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]  # fmt: skip
        response = self._request(query, timeout_s + 30.0)
        self._response = response
        try:
            # The response iterates over lines, one watch event each.
            for line in response:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone(self._path)
                    raise _Failed(f"watch {self._path}: {obj.get('message')}")
                version = obj.get("metadata", {}).get("resourceVersion") or version
                if event.get("type") == "BOOKMARK":
                    continue
                if event.get("type") == "DELETED":
                    self._sink.deleted(obj)
                else:
                    self._sink.changed(obj)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _Failed(f"watch {self._path}: {exc}") from exc
        finally:
            self._response = None
            response.release_conn()
        return version
