"""What the child watches saw: the operator's children and their pods, by owner, in memory.

The child watches (`child_watch`) list and watch every kind the operator creates, and the
pods of its Deployments, to learn which InferenceService to re-converge. Keeping what they
saw lets a reconcile read its children and pods here instead of listing them from the API
server: at 1000 services each reconcile made four list requests, the bulk of the
operator's reads, for objects the watches had already delivered (controller-runtime's
informer cache, in short).

A kind is `synced` once its first list is stored; until then (and while its watch is
re-listing after a failure) readers go to the API server. The watch thread stores an object
before it queues its owner, so a reconcile started by an event sees at least that event.
The operator's own writes are stored as the API server answered them (`store`), so the next
reconcile does not read the object as it was before the write; an event older than what is
stored (by `resourceVersion`) is ignored. A kind whose CRD is absent is synced and empty.
A new state that differs from the stored one in its status alone is stored but is no news
unless it changes what a reconcile reads of that status (the kind's `reading`; of most kinds,
nothing): at 1000 services the disruption controller's updates of the PodDisruptionBudgets'
status were thousands of reconciles with nothing to do, and most of the pods' and the
Deployments' status updates were events that changed nothing a reconcile reads.

To keep the fleet's objects small, the managed-fields bookkeeping of other managers is
dropped: a reconcile reads only the operator's own entries (whether it still owns a child's
fields as the `Update` manager that created it), and `kube` reads the others fresh when it
rewrites the entries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fleetserve_operator import naming
from fleetserve_operator.records import Manifest

__all__ = ["ChildCache", "ObjectKey", "is_newer", "object_key"]

ObjectKey = tuple[str, str]
"""(namespace, name) of an object of one kind."""
_OwnerKey = tuple[str, str]
"""(namespace, InferenceService name)."""


def _owner(obj: Manifest) -> _OwnerKey | None:
    """The InferenceService an object is labelled for (what `kube`'s list selector matches)."""
    meta = obj["metadata"]
    labels = meta.get("labels") or {}
    owner = labels.get(naming.INSTANCE_LABEL)
    if labels.get(naming.MANAGED_BY_LABEL) != naming.MANAGER or not owner:
        return None
    return (meta.get("namespace", ""), owner)


def _version(obj: Manifest) -> int | None:
    """The object's resourceVersion as a number, or None when it is not one."""
    version = obj["metadata"].get("resourceVersion")
    return int(version) if isinstance(version, str) and version.isdigit() else None


_BOOKKEEPING = frozenset({"resourceVersion", "managedFields"})
"""Metadata every write changes, whatever it changed: not news by itself."""
_NOT_CONTENT = frozenset({"apiVersion", "kind", "metadata", "status"})
"""Top-level keys `_alike_but_status` leaves out (a listed item has no kind of its own)."""


def _alike_but_status(obj: Manifest, stored: Manifest) -> bool:
    """Whether `obj` differs from `stored` in its status (and `_BOOKKEEPING`) at most.

    The operator's own managed-fields entries count: whether it still owns a child's fields
    decides whether it writes the child again (`render.needs_write`).
    """

    def essence(o: Manifest) -> tuple[Manifest, Manifest, object]:
        meta = {k: v for k, v in o["metadata"].items() if k not in _BOOKKEEPING}
        ours = _slim(o)["metadata"].get("managedFields")
        return meta, {k: v for k, v in o.items() if k not in _NOT_CONTENT}, ours

    return essence(obj) == essence(stored)


def _reads_alike(reading: Callable[[Manifest], object], obj: Manifest, stored: Manifest) -> bool:
    """Whether a reconcile reads the same of both states; one it cannot read is news."""
    try:
        return reading(obj) == reading(stored)
    except Exception:  # a reconcile reports what it makes of it; the watch must go on
        return False


def _slim(obj: Manifest) -> Manifest:
    """`obj` without the managed-fields entries no reader needs (see the module's docstring)."""
    meta = obj["metadata"]
    entries: list[Mapping[str, Any]] = meta.get("managedFields") or []
    ours = [entry for entry in entries if entry.get("manager") == naming.MANAGER]
    if len(ours) == len(entries):
        return obj
    return {**obj, "metadata": {**meta, "managedFields": ours}}


class ChildCache:
    """The objects of each watched kind, indexed by the InferenceService they belong to."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[ObjectKey, Manifest]] = {}
        """kind → (namespace, name) → object, for every kind listed at least once."""
        self._owned: dict[_OwnerKey, dict[tuple[str, str], None]] = {}
        """(namespace, owner) → (kind, name) of its objects."""
        self._synced: set[tuple[str, str | None]] = set()
        """(kind, namespace listed; None for every namespace)."""
        self._guard = threading.Lock()

    def synced(self, namespace: str, kinds: Iterable[str]) -> bool:
        """Whether every kind of `kinds` holds a complete listing of `namespace`."""
        with self._guard:
            return all(
                (kind, namespace) in self._synced or (kind, None) in self._synced for kind in kinds
            )

    def replace(
        self, kind: str, api_version: str, namespace: str | None, items: Iterable[Manifest]
    ) -> None:
        """A new listing of `kind` in `namespace` (None: every namespace), synced from now on.

        Items of a list carry no kind: it is added here.
        """
        with self._guard:
            self._clear(kind, namespace)
            for item in items:
                self._put(kind, {"apiVersion": api_version, "kind": kind, **item})
            self._synced.add((kind, namespace))

    def unsync(self, kind: str, namespace: str | None) -> None:
        """The watch of `kind` failed: readers go to the API server until it is listed again."""
        with self._guard:
            self._synced.discard((kind, namespace))

    def mark_absent(self, kind: str, namespace: str | None) -> None:
        """`kind` is not served (its CRD is missing): synced, with nothing in it."""
        self.replace(kind, "", namespace, ())

    def store(
        self, kind: str, obj: Manifest, *, reading: Callable[[Manifest], object] | None = None
    ) -> bool:
        """An object of `kind` as a watch event or a write returned it, unless newer is stored.

        Returns whether it is news: False for a state already stored, or one older than
        stored (the echo of the operator's own write, which `store` saw first), or one
        whose status alone changed, unless that changed its `reading` (None: nothing of
        the status is read).
        """
        with self._guard:
            stored = self._objects.get(kind, {}).get(object_key(obj))
            if stored is not None and not is_newer(obj, stored):
                return False
            if kind in self._objects:
                self._put(kind, obj if "kind" in obj else {"kind": kind, **obj})
            if stored is None or not _alike_but_status(obj, stored):
                return True
            return reading is not None and not _reads_alike(reading, obj, stored)

    def discard(self, kind: str, obj: Manifest) -> None:
        """The object was deleted (the same object: a new one of that name has another uid)."""
        with self._guard:
            stored = self._objects.get(kind, {}).get(object_key(obj))
            uid = obj["metadata"].get("uid")
            if stored is not None and (uid is None or stored["metadata"].get("uid") == uid):
                self._remove(kind, object_key(obj))

    def owned(self, namespace: str, owner: str, kinds: Iterable[str]) -> list[Manifest]:
        """The objects of `kinds` labelled for InferenceService `owner` (shared: do not edit)."""
        wanted = set(kinds)
        with self._guard:
            names = self._owned.get((namespace, owner), {})
            return [
                self._objects[kind][(namespace, name)] for kind, name in names if kind in wanted
            ]

    def _clear(self, kind: str, namespace: str | None) -> None:
        objects = self._objects.setdefault(kind, {})
        for key in [key for key in objects if namespace is None or key[0] == namespace]:
            self._remove(kind, key)

    def _put(self, kind: str, obj: Manifest) -> None:
        key = object_key(obj)
        if key in self._objects[kind]:
            self._remove(kind, key)
        self._objects[kind][key] = _slim(obj)
        owner = _owner(obj)
        if owner is not None:
            self._owned.setdefault(owner, {})[(kind, key[1])] = None

    def _remove(self, kind: str, key: ObjectKey) -> None:
        obj = self._objects[kind].pop(key)
        owner = _owner(obj)
        if owner is None:
            return
        names = self._owned.get(owner, {})
        names.pop((kind, key[1]), None)
        if not names:
            self._owned.pop(owner, None)


def object_key(obj: Manifest) -> ObjectKey:
    """(namespace, name) of `obj`, the key both caches keep objects under."""
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


def is_newer(obj: Manifest, stored: Manifest) -> bool:
    """Whether `obj` was written after `stored` (else the cache is already past it).

    Compared by resourceVersion, which the API server documents as opaque; it is etcd's
    revision, one counter for every object, so a late event of a deleted object's
    predecessor is older than the object that replaced it too.
    """
    new, old = _version(obj), _version(stored)
    return new is None or old is None or new > old
