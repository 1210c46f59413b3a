"""The operator's own watch of the InferenceServices: a warm cache and prompt spec changes.

kopf watches the InferenceServices too, but only after it has handled every object of its
first listing: at 1000 services a new leader spent about 13 seconds on that listing before
its watch began, and a change made meanwhile to a service already resumed waited all that
time (the replay's resumes read each service once, early). This watch, started with the
child watches as soon as the operator leads, sees such a change within a moment: an event
whose `metadata.generation` is past the one last known queues the service in the change
lane, ahead of the replay. kopf's own update handler still runs when its watch delivers
the change, and finds nothing left to do.

Its listing fills the `ServiceCache` at once, so the replay's reconciles read the services
there instead of one GET each. Events store every state, as kopf's event handler does; the
newer by resourceVersion wins, whichever stores first.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.records import Manifest

__all__ = ["ServiceSink"]

Key = tuple[str, str]


class ServiceSink:
    """What the InferenceServices' list-watch of one namespace (None: all) saw.

    `on_change` is called (from the watch thread) with the key of a service whose spec
    changed, after the new state is stored.
    """

    def __init__(
        self, services: ServiceCache, on_change: Callable[[Key], None], namespace: str | None
    ) -> None:
        self._services = services
        self._on_change = on_change
        self._namespace = namespace

    def listed(self, items: list[Manifest], version: str) -> None:
        """Keep the listing; services gone since leave tombstones."""
        self._services.replace(self._namespace, items, version)

    def changed(self, obj: Manifest) -> None:
        """Keep the new state; queue a spec change (a new generation of a known service)."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        before = self._services.generation(*key)
        self._services.store(obj, given=True)
        # A service first seen here is a create, which kopf's create handler serves; one
        # whose new generation was already stored came through kopf's event handler first,
        # and its update handler follows.
        if before is not None and int(meta.get("generation", 0)) > before:
            self._on_change(key)

    def deleted(self, obj: Manifest) -> None:
        """Forget the service (a tombstone at its deletion's version)."""
        self._services.discard(obj)

    def lost(self) -> None:
        """Nothing to drop: readers keep the last state, and the re-list brings the rest."""

    def absent(self) -> None:
        """The CRD is not installed: there are no InferenceServices to keep."""
