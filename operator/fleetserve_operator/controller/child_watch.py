"""Watches of the operator's children: one thread per kind and namespace, feeding a work queue.

Every event of a child (Deployment, Service, ConfigMap, HTTPRoute, GRPCRoute, ScaledObject,
PodDisruptionBudget) or of a pod of one only says which InferenceService to re-converge, so
the event is reduced to its owner's key (`owner_key`) and added to the `WorkQueue`; the
object itself is kept in a `ChildCache`, where reconciles read their children and pods.
kopf would instead start a worker and an event queue per watched object: thousands of each
at 1000 services, and every event kept until its worker ran. The event of a state the cache
already holds (the echo of the operator's own write, stored as the API server answered it)
queues nothing: the reconcile that wrote it has seen it.

A watch is label-selected to the operator's own children (`managed-by`), resumes from the
last resourceVersion it saw (bookmarks included) when the server ends it, and re-lists when
that version is too old (410 Gone). Every list queues the owner of every object listed, at
start (a child deleted while no leader ran) and after a 410 or a failure (events may have
been lost), through `on_listed`: a listing names every service, a resync's worth of
reconciles, which must not take the workers a user's change needs (the operator queues
them in the resync lane).
A kind whose CRD is absent (no Gateway API, no KEDA) answers 404; its watch waits
`absent_retry_s` and tries again, so it starts once the CRD appears. Other failures are
logged and retried after `retry_s`. Requests go by path through the client's `ApiClient`,
as in `kube`, and events are parsed as plain JSON: no model objects.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3

from fleetserve_operator import naming
from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.records import Manifest

__all__ = ["CHILD_KINDS", "ChildKind", "ChildWatches", "owner_key"]

logger = logging.getLogger(__name__)

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ChildKind:
    """A kind the operator creates (or, for pods, whose state it reports)."""

    api_version: str
    kind: str
    plural: str

    def path(self, namespace: str | None) -> str:
        """The collection's path, in `namespace` or (None) cluster-wide."""
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{prefix}/{self.plural}" if namespace is None else (
            f"{prefix}/namespaces/{namespace}/{self.plural}"
        )  # fmt: skip


# Pods: a container that crashes at start, or whose image cannot be pulled, changes neither
# its Deployment nor its ReplicaSet; only its pod says so. HTTPRoutes: a weight edited by
# hand would otherwise send users to a canary until the next resync (a GRPCRoute's too).
CHILD_KINDS = (
    ChildKind("apps/v1", "Deployment", "deployments"),
    ChildKind("v1", "Service", "services"),
    ChildKind("v1", "ConfigMap", "configmaps"),
    ChildKind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    ChildKind("gateway.networking.k8s.io/v1", "GRPCRoute", "grpcroutes"),
    ChildKind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects"),
    ChildKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ChildKind("v1", "Pod", "pods"),
)
_SELECTOR = f"{naming.MANAGED_BY_LABEL}={naming.MANAGER}"


def owner_key(kind: str, obj: Mapping[str, Any]) -> Key | None:
    """The InferenceService an event of `obj` (of `kind`) is about; None for anything else.

    A child names its InferenceService as its controller owner reference; a pod's owner is
    a ReplicaSet, so a pod is mapped by the instance label its Deployment gave it.
    """
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    if not namespace:
        return None
    if kind == "Pod":
        labels = meta.get("labels") or {}
        if labels.get(naming.MANAGED_BY_LABEL) != naming.MANAGER:
            return None
        owner = labels.get(naming.INSTANCE_LABEL)
        return (namespace, owner) if owner else None
    for ref in meta.get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("apiVersion") == naming.API_VERSION
            and ref.get("kind") == naming.KIND
            and ref.get("name")
        ):
            return (namespace, ref["name"])
    return None


class _Gone(Exception):
    """The resourceVersion to resume from is too old (410): re-list."""


class _Absent(Exception):
    """The kind is not served (its CRD is not installed)."""


class _Failed(Exception):
    """Any other failed request; retried after a pause."""


class _KindWatch:
    """One kind in one namespace (or the whole cluster), on its own thread."""

    def __init__(
        self,
        watches: ChildWatches,
        kind: ChildKind,
        namespace: str | None,
    ) -> None:
        self._watches = watches
        self._kind = kind
        self._namespace = namespace
        self._path = kind.path(namespace)
        self._response: urllib3.BaseHTTPResponse | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"watch-{kind.plural}-{namespace or '*'}", daemon=True
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
        watches = self._watches
        cache = watches.cache
        version: str | None = None
        while not watches.stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
            except _Gone:
                version = None
                cache.unsync(self._kind.kind, self._namespace)
            except _Absent:
                version = None
                cache.mark_absent(self._kind.kind, self._namespace)
                if watches.stopping.wait(watches.absent_retry_s):
                    return
            except _Failed as exc:
                cache.unsync(self._kind.kind, self._namespace)
                if watches.stopping.is_set():
                    return
                logger.warning("watch of %s failed, retried: %s", self._path, exc)
                version = None
                if watches.stopping.wait(watches.retry_s):
                    return

    def _request(
        self, query: list[tuple[str, str]], read_timeout_s: float
    ) -> urllib3.BaseHTTPResponse:
        client = self._watches.client
        request = client.param_serialize(
            "GET", self._path, query_params=[("labelSelector", _SELECTOR), *query],
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
        """List the kind, queueing the owner of every object; returns its resourceVersion."""
        response = self._request([], self._watches.request_timeout_s)
        try:
            listed: Manifest = json.loads(response.read())
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _Failed(f"list {self._path}: {exc}") from exc
        items = listed.get("items") or []
        kind = self._kind
        self._watches.cache.replace(kind.kind, kind.api_version, self._namespace, items)
        for item in items:
            self._watches.notify(kind.kind, item, listed=True)
        return str(listed["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        """Follow events from `version` until the server ends the watch; the last version."""
        timeout_s = self._watches.watch_timeout_s
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
                    self._watches.cache.discard(self._kind.kind, obj)
                elif not self._watches.cache.store(self._kind.kind, obj):
                    continue  # the echo of the operator's own write: nothing new to see
                self._watches.notify(self._kind.kind, obj)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _Failed(f"watch {self._path}: {exc}") from exc
        finally:
            self._response = None
            response.release_conn()
        return version


class ChildWatches:
    """The watch threads of every child kind in the operator's namespaces.

    `on_owner` is called (from the watch threads) with the key of the InferenceService an
    event is about, after the object is kept in `cache` (a new one unless given);
    `on_listed` (`on_owner` unless given) with the owner of each object a list returned.
    """

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        namespaces: Sequence[str],
        on_owner: Callable[[Key], None],
        on_listed: Callable[[Key], None] | None = None,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 30.0,
        retry_s: float = 5.0,
        absent_retry_s: float = 60.0,
        kinds: Sequence[ChildKind] = CHILD_KINDS,
        cache: ChildCache | None = None,
    ) -> None:
        self.client = client
        self.cache = cache or ChildCache()
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.retry_s = retry_s
        self.absent_retry_s = absent_retry_s
        self.stopping = threading.Event()
        self._on_owner = on_owner
        self._on_listed = on_listed or on_owner
        scopes: Sequence[str | None] = list(namespaces) or [None]
        self._watches = [_KindWatch(self, kind, ns) for kind in kinds for ns in scopes]

    def notify(self, kind: str, obj: Mapping[str, Any], *, listed: bool = False) -> None:
        """Queue the owner of an event's (or a list's) object, if it is one of ours."""
        key = owner_key(kind, obj)
        if key is not None:
            (self._on_listed if listed else self._on_owner)(key)

    def start(self) -> None:
        """Start one thread per kind and namespace."""
        self.stopping.clear()
        for watch in self._watches:
            watch.thread.start()

    def stop(self) -> None:
        """Stop every watch: open ones are closed, sleeping ones woken."""
        self.stopping.set()
        for watch in self._watches:
            watch.interrupt()
        for watch in self._watches:
            if watch.thread.is_alive():
                watch.thread.join(timeout=5.0)
