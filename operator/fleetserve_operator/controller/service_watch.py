"""The operator's watch of the InferenceServices: what to reconcile, and in which lane.

Every create, spec change and deletion of an InferenceService reaches the operator here, on
the same list-watch loop as the children (`list_watch`), started with the child watches as
soon as the operator leads. It decides, from the object alone, what a reconcile is owed:

- a service whose `status.observedGeneration` is absent was never reconciled: a create, in
  the change lane;
- one whose `metadata.generation` is past its `status.observedGeneration`, or past the one
  last known here, has a spec the operator has not converged yet: a change, in the change
  lane (this also catches a change whose event came after the operator's own status write
  had stored the new generation: the echo of that write reports the older one as observed);
- one first seen and up to date (a new leader's listing, which names every service) is
  resumed in the rate-limited resync lane, so the replay never holds back a user's change;
- a deletion queues the key, and the reconcile that finds the tombstone drops what the
  operator kept of the service (its gauges).

Its listing fills the `ServiceCache` at once, with tombstones for services it no longer
names, so reconciles read the services there instead of one GET each. Events store every
state; the newer by resourceVersion wins, against the operator's own writes too.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Protocol

from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.records import Manifest

__all__ = ["Owed", "ServiceQueue", "ServiceSink", "owed"]

Key = tuple[str, str]


class Owed(Enum):
    """The reconcile a state of a service is owed (see the module docstring)."""

    CREATE = "create"
    CHANGE = "change"
    RESUME = "resume"


class ServiceQueue(Protocol):
    """Where the reconciles a service is owed go (`handlers.QueueWorkers`)."""

    def create(self, key: Key) -> None:
        """A service never reconciled: the change lane."""

    def change(self, key: Key) -> None:
        """A spec not converged yet: the change lane."""

    def resume(self, key: Key) -> None:
        """A service up to date, first seen: the resync lane."""

    def gone(self, key: Key) -> None:
        """A service deleted: drop what is kept of it."""


def owed(obj: Mapping[str, Any], known_generation: int | None) -> Owed | None:
    """The reconcile `obj` is owed; None: none.

    `known_generation`: the generation last known of it before this state; None when it
    was not known.
    """
    generation = _generation(obj)
    observed = (obj.get("status") or {}).get("observedGeneration")
    if observed is None:
        return Owed.CREATE if known_generation is None else None
    if int(observed) < generation or (
        known_generation is not None and generation > known_generation
    ):
        return Owed.CHANGE
    return Owed.RESUME if known_generation is None else None


class ServiceSink:
    """What the InferenceServices' list-watch of one namespace (None: all) saw."""

    def __init__(self, services: ServiceCache, queue: ServiceQueue, namespace: str | None) -> None:
        self._services = services
        self._queue = queue
        self._namespace = namespace
        self._generations: dict[Key, int] = {}
        """The generation this watch last saw of each service. Not the cache's: a reconcile
        reads a service the watch has not listed yet from the API server and stores it
        there, and a new leader's listing must still resume it."""

    def listed(self, items: list[Manifest], version: str) -> None:
        """Keep the listing; services gone since leave tombstones and are dropped."""
        before, self._generations = self._generations, {}
        self._services.replace(self._namespace, items, version)
        for item in items:
            key = _key(item)
            self._generations[key] = _generation(item)
            self._queue_owed(key, owed(item, before.get(key)))
        for key in before.keys() - self._generations.keys():
            self._queue.gone(key)

    def changed(self, obj: Manifest) -> None:
        """Keep the new state; queue the reconcile it is owed."""
        key = _key(obj)
        before = self._generations.get(key)
        self._generations[key] = _generation(obj)
        self._services.store(obj, given=True)
        self._queue_owed(key, owed(obj, before))

    def deleted(self, obj: Manifest) -> None:
        """Forget the service (a tombstone at its deletion's version)."""
        key = _key(obj)
        self._generations.pop(key, None)
        self._services.discard(obj)
        self._queue.gone(key)

    def lost(self) -> None:
        """Nothing to drop: readers keep the last state, and the re-list brings the rest."""

    def absent(self) -> None:
        """The CRD is not installed: there are no InferenceServices to keep."""

    def _queue_owed(self, key: Key, reconcile: Owed | None) -> None:
        if reconcile is Owed.CREATE:
            self._queue.create(key)
        elif reconcile is Owed.CHANGE:
            self._queue.change(key)
        elif reconcile is Owed.RESUME:
            self._queue.resume(key)


def _generation(obj: Mapping[str, Any]) -> int:
    return int(obj["metadata"].get("generation", 0))


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj["metadata"]
    return (meta["namespace"], meta["name"])
