"""Watches of the operator's children: one thread per kind and namespace, feeding a work queue.

Every event of a child (Deployment, Service, ConfigMap, HTTPRoute, GRPCRoute, ScaledObject,
PodDisruptionBudget) or of a pod of one only says which InferenceService to re-converge, so
the event is reduced to its owner's key (`owner_key`) and added to the `WorkQueue`; the
object itself is kept in a `ChildCache`, where reconciles read their children and pods.
kopf would instead start a worker and an event queue per watched object: thousands of each
at 1000 services, and every event kept until its worker ran. The event of a state the cache
already holds (the echo of the operator's own write, stored as the API server answered it)
queues nothing: the reconcile that wrote it has seen it.

A watch (`list_watch.ListWatch`) is label-selected to the operator's own children
(`managed-by`). Every list queues the owner of every object listed, at
start (a child deleted while no leader ran) and after a 410 or a failure (events may have
been lost), through `on_listed`: a listing names every service, a resync's worth of
reconciles, which must not take the workers a user's change needs (the operator queues
them in the resync lane).
A kind whose CRD is absent (no Gateway API, no KEDA) is synced and empty in the cache
until its CRD appears.

The same threads can watch the InferenceServices themselves (`services`, a
`service_watch.ServiceSink`): started with the children's, after the operator leads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes

from fleetserve_operator import naming
from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.controller.list_watch import ListWatch, WatchSettings, WatchSink
from fleetserve_operator.records import Manifest

__all__ = ["CHILD_KINDS", "SERVICES", "ChildKind", "ChildWatches", "owner_key"]

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ChildKind:
    """A kind the operator watches: one it creates, pods, or the InferenceServices."""

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
SERVICES = ChildKind(naming.API_VERSION, naming.KIND, naming.PLURAL)
"""The InferenceServices themselves, as a collection to watch."""


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


class _ChildSink:
    """One child kind's list-watch in one namespace (None: all): cached, owners queued."""

    def __init__(self, watches: ChildWatches, kind: ChildKind, namespace: str | None) -> None:
        self._watches = watches
        self._kind = kind
        self._namespace = namespace

    def listed(self, items: list[Manifest], version: str) -> None:
        kind = self._kind
        self._watches.cache.replace(kind.kind, kind.api_version, self._namespace, items)
        for item in items:
            self._watches.notify(kind.kind, item, listed=True)

    def changed(self, obj: Manifest) -> None:
        reading = self._watches.readings.get(self._kind.kind)
        if self._watches.cache.store(self._kind.kind, obj, reading=reading):
            self._watches.notify(self._kind.kind, obj)
        # else the echo of the operator's own write (the reconcile that wrote it has seen
        # it), or a status change no reconcile would see

    def deleted(self, obj: Manifest) -> None:
        self._watches.cache.discard(self._kind.kind, obj)
        self._watches.notify(self._kind.kind, obj)

    def lost(self) -> None:
        self._watches.cache.unsync(self._kind.kind, self._namespace)

    def absent(self) -> None:
        self._watches.cache.mark_absent(self._kind.kind, self._namespace)


class ChildWatches:
    """The watch threads of every child kind in the operator's namespaces.

    `readings`, by kind: what a reconcile reads of the status of that kind's objects (the
    operator's are `observe.STATUS_READINGS`). A change of an object's status alone queues
    its owner only when it changes that reading; of a kind without one, never.
    `on_owner` is called (from the watch threads) with the key of the InferenceService an
    event is about, after the object is kept in `cache` (a new one unless given);
    `on_listed` (`on_owner` unless given) with the owner of each object a list returned.
    With `services`, the InferenceServices of those namespaces are watched too, each
    namespace (None: all) into the sink it makes.
    """

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        namespaces: Sequence[str],
        readings: Mapping[str, Callable[[Manifest], object]],
        on_owner: Callable[[Key], None],
        on_listed: Callable[[Key], None] | None = None,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 30.0,
        retry_s: float = 5.0,
        absent_retry_s: float = 60.0,
        kinds: Sequence[ChildKind] = CHILD_KINDS,
        cache: ChildCache | None = None,
        services: Callable[[str | None], WatchSink] | None = None,
    ) -> None:
        self.cache = cache or ChildCache()
        self.settings = WatchSettings(
            client=client,
            stopping=threading.Event(),
            watch_timeout_s=watch_timeout_s,
            request_timeout_s=request_timeout_s,
            retry_s=retry_s,
            absent_retry_s=absent_retry_s,
        )
        self.readings = readings
        self._on_owner = on_owner
        self._on_listed = on_listed or on_owner
        scopes: Sequence[str | None] = list(namespaces) or [None]
        self._watches = [
            ListWatch(self.settings, kind.path(ns), _ChildSink(self, kind, ns), selector=_SELECTOR)
            for kind in kinds
            for ns in scopes
        ]
        if services is not None:
            self._watches += [
                ListWatch(self.settings, SERVICES.path(ns), services(ns)) for ns in scopes
            ]

    def notify(self, kind: str, obj: Mapping[str, Any], *, listed: bool = False) -> None:
        """Queue the owner of an event's (or a list's) object, if it is one of ours."""
        key = owner_key(kind, obj)
        if key is not None:
            (self._on_listed if listed else self._on_owner)(key)

    def start(self) -> None:
        """Start one thread per kind and namespace."""
        self.settings.stopping.clear()
        for watch in self._watches:
            watch.thread.start()

    def stop(self) -> None:
        """Stop every watch: open ones are closed, sleeping ones woken."""
        self.settings.stopping.set()
        for watch in self._watches:
            watch.interrupt()
        for watch in self._watches:
            if watch.thread.is_alive():
                watch.thread.join(timeout=5.0)
