"""The InferenceServices as the operator's watch and its own writes last showed them.

Every reconcile starts by reading its InferenceService. A GET for it was, once the children
came from the watches' cache, the one read left on every reconcile (a child event's, a
resync's), four per service created at 200 services. The operator's watch of the services
(`service_watch`) stores every event here before it queues the reconcile that event is
owed, so that reconcile reads at least that state; its listing fills the cache as soon as
the operator leads.

A reconcile must report from the status the previous one wrote, or it would write that
status, and post its Events, a second time. So the operator's own writes of an
InferenceService (its status, a command annotation or a finalizer removed) are stored as
the API server answered them, before the watch delivers them; an event older than what is
stored (by `resourceVersion`, as in `cache.ChildCache`) changes nothing. A deleted service leaves a
tombstone at the deletion's version, so a write answered just before the deletion and
stored just after it cannot bring the object back; so does a service that a new listing
no longer names (deleted while no watch ran). A service not seen yet (the first listings
still under way) is not here, and readers go to the API server.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from fleetserve_operator.controller.cache import ObjectKey, is_newer, object_key
from fleetserve_operator.records import Manifest, json_copy

__all__ = ["ServiceCache"]


class ServiceCache:
    """The last known state of each InferenceService, newest by `resourceVersion`."""

    def __init__(self) -> None:
        self._objects: dict[ObjectKey, Manifest] = {}
        self._deleted: dict[ObjectKey, Manifest] = {}
        """The deletion seen of each service gone, until one of that name appears again."""
        self._guard = threading.Lock()

    def store(self, obj: Manifest, *, given: bool = False) -> None:
        """A state of an InferenceService (a watch event, an answer to a write), kept if newer.

        `obj` is copied, as a caller may go on editing its own, unless `given`: the caller
        gives away an object no one else holds (one decoded for it), and never edits it.
        """
        key = object_key(obj)
        with self._guard:
            older = self._objects.get(key) or self._deleted.get(key)
            if older is not None and not is_newer(obj, older):
                return
            self._deleted.pop(key, None)
            self._objects[key] = obj if given else json_copy(obj)

    def replace(self, namespace: str | None, items: list[Manifest], version: str) -> None:
        """A listing of `namespace` (None: every namespace) at resourceVersion `version`.

        Each item is stored as by `store`, given (a listing is decoded for this cache); a
        service known in that scope but not listed was deleted while no watch ran, and
        leaves a tombstone at the listing's version.
        """
        listed = {object_key(item) for item in items}
        for item in items:
            self.store(item, given=True)
        with self._guard:
            gone = [
                key for key in self._objects if key not in listed and namespace in (None, key[0])
            ]
            for key in gone:
                del self._objects[key]
                self._deleted[key] = {"metadata": {"resourceVersion": version}}

    def discard(self, obj: Manifest) -> None:
        """The InferenceService `obj` (its DELETED event) is gone."""
        key = object_key(obj)
        with self._guard:
            self._objects.pop(key, None)
            version = obj["metadata"].get("resourceVersion")
            self._deleted[key] = {"metadata": {"resourceVersion": version}}

    def get(self, namespace: str, name: str) -> Manifest | None:
        """A copy of the service's last known state; None when it was never seen or is gone."""
        with self._guard:
            found = self._objects.get((namespace, name))
        return None if found is None else json_copy(found)

    def alive(self) -> list[ObjectKey]:
        """The services alive, as (namespace, name), sorted."""
        with self._guard:
            return sorted(self._objects)

    def is_alive(self, namespace: str, name: str) -> bool:
        """Whether the service is known and not deleted."""
        with self._guard:
            return (namespace, name) in self._objects

    def status(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The service's last known status, uncopied (read it, never edit it); None: unknown."""
        with self._guard:
            found = self._objects.get((namespace, name))
        return None if found is None else found.get("status") or {}

    def knows(self, namespace: str, name: str) -> bool:
        """Whether the service was seen, alive or deleted (else only the API server can say)."""
        with self._guard:
            return (namespace, name) in self._objects or (namespace, name) in self._deleted
