"""The `Cluster` a reconcile uses in the operator: reads from the watches, Events queued.

`CachedKube` wraps the API (`kube.KubeApi`) and answers the two reads every reconcile makes,
its children and their pods, from the `ChildCache` the child watches fill, once that holds
a complete listing of the kinds read (else from the API server, as before). Every write of
a child goes to the API server, and what it answers is stored in the cache, so the next
reconcile reads the child as written even before the watch delivers it. Events are posted
by an `EventPoster`. The InferenceService itself is read from the `ServiceCache` that the
operator's watch of the services and its own writes of them fill (its status, a command
annotation or a finalizer removed), once the service was seen there.
"""

from __future__ import annotations

from fleetserve_operator.controller.cache import ChildCache
from fleetserve_operator.controller.child_watch import CHILD_KINDS
from fleetserve_operator.controller.events import EventPoster
from fleetserve_operator.controller.kube import Cluster, ObjectRef
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.records import EventNote, Manifest, json_copy

__all__ = ["CachedKube"]

_POD = "Pod"
_CHILDREN = tuple(kind.kind for kind in CHILD_KINDS if kind.kind != _POD)


class CachedKube:
    """`api` with reads from `cache` (children, pods) and `services`, Events by `events`."""

    def __init__(
        self, api: Cluster, cache: ChildCache, events: EventPoster, services: ServiceCache
    ) -> None:
        self._api = api
        self._cache = cache
        self._events = events
        self._services = services

    def list_children(self, namespace: str, owner: str) -> list[Manifest]:
        """`owner`'s children, from the cache once every child kind is listed there."""
        if not self._cache.synced(namespace, _CHILDREN):
            return self._api.list_children(namespace, owner)
        return json_copy(self._cache.owned(namespace, owner, _CHILDREN))

    def list_pods(self, namespace: str, owner: str) -> list[Manifest]:
        """`owner`'s pods, from the cache once pods are listed there."""
        if not self._cache.synced(namespace, (_POD,)):
            return self._api.list_pods(namespace, owner)
        return json_copy(self._cache.owned(namespace, owner, (_POD,)))

    def create(self, manifest: Manifest) -> Manifest:
        """Create through the API; the created object is cached."""
        created = self._api.create(manifest)
        self._cache.store(manifest["kind"], json_copy(created))
        return created

    def apply(self, manifest: Manifest, *, current: Manifest) -> Manifest:
        """Apply through the API; the applied object is cached."""
        applied = self._api.apply(manifest, current=current)
        self._cache.store(manifest["kind"], json_copy(applied))
        return applied

    def delete(self, manifest: Manifest) -> None:
        """Delete through the API, and from the cache."""
        self._api.delete(manifest)
        self._cache.discard(manifest["kind"], manifest)

    def post_event(self, ref: ObjectRef, note: EventNote) -> None:
        """Queue the Event (`EventPoster`)."""
        self._events.post(ref, note)

    def get_child(self, manifest: Manifest) -> Manifest | None:
        """The API's."""
        return self._api.get_child(manifest)

    def validate(self, manifest: Manifest, *, current: Manifest | None) -> None:
        """The API's."""
        self._api.validate(manifest, current=current)

    def apply_status(self, ref: ObjectRef, status: Manifest) -> Manifest | None:
        """Through the API; the service as written is cached (shared: do not edit it)."""
        return self._stored(self._api.apply_status(ref, status), given=True)

    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        """From `services` once it saw the service (alive or gone), else the API's."""
        if self._services.knows(namespace, name):
            return self._services.get(namespace, name)
        return self._stored(self._api.get_inference_service(namespace, name), given=False)

    def _stored(self, service: Manifest | None, *, given: bool) -> Manifest | None:
        """`service` (an answer of the API) cached; `given`: the cache keeps it uncopied.

        A status write's answer is the one copied most (every reconcile that reports
        writes one); its caller only reads it. A read's answer is the reconcile's to edit.
        """
        if service is not None:
            self._services.store(service, given=given)
        return service

    def pvc_exists(self, namespace: str, claim: str) -> bool:
        """The API's."""
        return self._api.pvc_exists(namespace, claim)

    def read_secret(self, namespace: str, name: str, key: str) -> bytes | None:
        """The API's."""
        return self._api.read_secret(namespace, name, key)

    def remove_annotation(self, ref: ObjectRef, annotation: str) -> Manifest | None:
        """Through the API; the service as written is cached (the command is not seen twice).

        Shared with the cache: do not edit it.
        """
        return self._stored(self._api.remove_annotation(ref, annotation), given=True)

    def remove_finalizer(self, service: Manifest, finalizer: str) -> Manifest | None:
        """Through the API; a copy of the service as written is cached.

        The answer is the caller's: the reconcile goes on with it, and may edit it.
        """
        return self._stored(self._api.remove_finalizer(service, finalizer), given=False)
