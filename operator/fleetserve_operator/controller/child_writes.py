"""The children's writes of one reconcile: checked before any is made, then made in order.

`Sync` decides what the children should be; this module writes them, as steps 3 and 5 of a
reconcile (see `sync`): every write is dry-run on the API server first, so a refused child
stops them all before anything is written and a name taken by another's object is found
and left alone (`ChildConflict`); then the writes and deletions are made phase by phase in
`render.converge_phase` order. The requests of one step that do not depend on one another
(each child's dry-run; the writes of one phase, such as a change's canary Deployment and
Service) go at once on the `write_threads`, since a reconcile mostly waits on the API
server. Each write made is noted (`EventNote`) for the reconcile's Events.

A service's first create is the exception (`first_writes`, `create_first`): nothing of it
exists yet, so each child is created without a dry-run of its own, the Deployments after
every child that could still be refused (`render.first_create_phase`), and when a create
fails the children created are deleted again. It ends as a checked create does, with
nothing built and no pod started, for one request per child less: the dry-runs were a
third of the requests that bring a fleet up, and the API server spends as much on a
dry-run as on the create.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from fleetserve_operator import render
from fleetserve_operator.controller.kube import Cluster
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.errors import (
    ChildConflict,
    ChildRefused,
    ClusterUnavailable,
    SpecError,
)
from fleetserve_operator.records import EventNote, Manifest
from fleetserve_operator.render import Owner

__all__ = ["ChildWrite", "ChildWriter"]

T = TypeVar("T")
S = TypeVar("S")

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChildWrite:
    """A child to write: created when `current` is None, else applied onto it."""

    manifest: Manifest
    current: Manifest | None


class ChildWriter:
    """Checks and makes the children's writes through `kube`; shared by every reconcile.

    `write_threads`: threads that make a reconcile's independent requests beside it, shared
    by every reconcile; 0 makes them one after the other (the order tests read writes in).
    """

    def __init__(self, kube: Cluster, metrics: OperatorMetrics, *, write_threads: int = 0) -> None:
        self._kube = kube
        self._metrics = metrics
        self._writers = (
            ThreadPoolExecutor(write_threads, thread_name_prefix="child-write")
            if write_threads > 0
            else None
        )

    def checked_writes(
        self,
        owner: Owner,
        desired: list[Manifest],
        observed: list[Manifest],
        taken: set[tuple[str, str]],
    ) -> list[ChildWrite]:
        """The children to write, each checked before any is written.

        Every write is dry-run, in apply order, so the first refusal stops them all. A
        desired child not among `observed` is to be created; an object of its name that
        this service does not control is someone else's, and is never written. Such an
        object is found without a read for every new child: labelled as this service's
        (`taken`), or answered by the create's dry-run with a conflict (the name is taken),
        or a refusal of that dry-run (a quota on new objects refuses a create where an
        apply onto this service's own child would pass). Only then is it read, to tell a
        child of this service that the listing missed from another's. One created between
        the dry-run and the write is refused by the create itself (it is create-only):
        `ChildConflict` then stops the reconcile at that write.

        Raises:
            ChildConflict: a name is taken by an object this service does not control.
            ChildRefused: the API server refused a child.
            DependencyMissing: the HTTPRoute or GRPCRoute API is missing.
        """
        current = {render.child_key(child): child for child in observed}
        writes: list[ChildWrite] = []
        for child in desired:
            seen = current.get(render.child_key(child))
            if seen is None and render.child_key(child) in taken:
                seen = self._found(owner, child)
            if seen is None or render.needs_write(child, seen):
                writes.append(ChildWrite(child, seen))
        checks = [partial(self._checked, owner, write) for write in writes]
        return [write for write in self._each(checks) if write is not None]

    def first_writes(self, owner: Owner, desired: list[Manifest]) -> list[ChildWrite]:
        """The creates of a service's first reconcile, for `create_first`.

        Only the children made after its Deployments (`render.PODS_PHASE`) are dry-run:
        their refusal would come once pods had started. The others go unchecked, and
        `create_first` undoes them when one fails.

        Raises:
            ChildConflict, ChildRefused, DependencyMissing: as `checked_writes`, from those
                dry-runs, before anything is written.
        """
        unchecked = [ChildWrite(child, None) for child in desired if not _after_pods(child)]
        late = [
            partial(self._checked, owner, ChildWrite(child, None))
            for child in desired
            if _after_pods(child)
        ]
        return unchecked + [write for write in self._each(late) if write is not None]

    def _checked(self, owner: Owner, write: ChildWrite) -> ChildWrite | None:
        """`write` once its dry-run passed; None when it needs no write after all.

        A create whose name turned out taken by a child of this service becomes an apply
        onto it, checked again as such.
        """
        try:
            self._kube.validate(write.manifest, current=write.current)
            return write
        except ChildConflict:
            found = self._taken_by_ours(owner, write.manifest)
        except ChildRefused:
            seen = None if write.current is not None else self._found(owner, write.manifest)
            if seen is None:
                raise
            found = seen
        if not render.needs_write(write.manifest, found):
            return None
        self._kube.validate(write.manifest, current=found)
        return ChildWrite(write.manifest, found)

    def _each(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Every call's result in order, the calls made at once on the `write_threads`.

        All of them are waited for before the first failure (in order) is raised, so none
        is still in flight when the reconcile stops there.
        """
        if self._writers is None or len(calls) < 2:
            return [call() for call in calls]
        others = [self._writers.submit(call) for call in calls[1:]]
        try:
            first = calls[0]()
        finally:
            wait(others)
        return [first, *(other.result() for other in others)]

    def _found(self, owner: Owner, child: Manifest) -> Manifest | None:
        """The object named like `child`, if this service controls it; None when absent.

        Raises:
            ChildConflict: an object of that name exists and this service does not control it.
        """
        found = self._kube.get_child(child)
        if found is not None and not render.is_controlled_by(owner, found):
            kind, name = render.child_key(child)
            raise ChildConflict(kind, owner.namespace, name)
        return found

    def _taken_by_ours(self, owner: Owner, child: Manifest) -> Manifest:
        """The child of this service that holds the name a create of `child` found taken.

        Raises:
            ChildConflict: an object this service does not control holds it.
            ClusterUnavailable: it was deleted since (the reconcile is retried).
        """
        found = self._found(owner, child)
        if found is None:
            kind, name = render.child_key(child)
            msg = f"{kind} {name} was there to create, and gone again; retried"
            raise ClusterUnavailable(msg) from None
        return found

    def converge(
        self,
        owner: Owner,
        writes: list[ChildWrite],
        stale: list[Manifest],
        observed: list[Manifest],
        notes: list[EventNote],
    ) -> list[Manifest]:
        """Make the checked writes, delete the `stale` children; returns the children.

        In `render.converge_phase` order: routes never name what is not there. The steps of
        one phase do not depend on one another, and are made at once (`_each`). A create
        refused because the name is taken (since its dry-run, by a child of this service)
        is an apply onto that child instead. Every write made is added to `notes` as it is
        made, so a reconcile that fails part way still tells what it wrote.
        """
        written = {render.child_key(write.manifest) for write in writes}
        result = [child for child in observed if render.child_key(child) not in written]
        steps: list[ChildWrite | Manifest] = [*writes, *stale]
        for phase in _in_phases(steps, _phase):
            calls = [partial(self._converge_step, owner, notes, step) for step in phase]
            outcomes = self._each(calls)
            for step, made in zip(phase, outcomes, strict=True):
                if made is not None:
                    result.append(made)
                elif not isinstance(step, ChildWrite):
                    result.remove(step)
        return result

    def create_first(
        self, owner: Owner, writes: list[ChildWrite], notes: list[EventNote]
    ) -> list[Manifest]:
        """Make a service's first creates (`first_writes`); returns the children.

        In `render.first_create_phase` order, the creates of one phase at once. When one
        fails (refused, its name taken, its API missing, or the API server failing), every
        child this call created is deleted again before the error is raised (`_undo`), so
        the reconcile leaves nothing half built, as a refused dry-run does. Creates and
        deletions alike are added to `notes`.
        """
        made: list[Manifest] = []
        result: list[Manifest] = []
        try:
            for phase in _in_phases(
                writes, lambda write: render.first_create_phase(write.manifest)
            ):
                calls = [partial(self._converge_step, owner, notes, w, made) for w in phase]
                result += [child for child in self._each(calls) if child is not None]
        except (SpecError, ClusterUnavailable):
            # Also for a failing API server: `_each` raises the first failure of a phase in
            # call order, which may hide another call's refusal, and a create half made
            # now would be checked by the next reconcile's dry-runs and never undone.
            self._undo(made, notes)
            raise
        return result

    def _undo(self, made: list[Manifest], notes: list[EventNote]) -> None:
        """Delete the children a failed first create made, the last phase's first.

        A route is deleted before the Services it names, so no route is ever left naming a
        missing one: when a deletion fails, the phases before it are kept, and what is
        left (this service's own children) is logged. The next reconcile, no longer a
        first, dry-runs its writes and, once nothing refuses them, completes the service.
        """
        phases = _in_phases(made, render.first_create_phase)[::-1]
        for index, phase in enumerate(phases):
            left: list[Manifest] = []
            for child in phase:
                try:
                    self._deleted(notes, child)
                except ClusterUnavailable as exc:
                    logger.warning("a failed create could not delete %s: %s", _named(child), exc)
                    left.append(child)
            if left:
                kept = [*left, *(child for earlier in phases[index + 1 :] for child in earlier)]
                logger.warning("a failed create left %s", ", ".join(map(_named, kept)))
                return

    def _converge_step(
        self,
        owner: Owner,
        done: list[EventNote],
        step: ChildWrite | Manifest,
        made: list[Manifest] | None = None,
    ) -> Manifest | None:
        """One step of a converge: the child written, or None for a stale one deleted.

        A child created is also added to `made`, where given.
        """
        if isinstance(step, ChildWrite):
            if step.current is None:
                return self._created(owner, done, step, made)
            applied = self._kube.apply(step.manifest, current=step.current)
            self._write(done, step.manifest, "Updated")
            return applied
        self._deleted(done, step)
        return None

    def _deleted(self, done: list[EventNote], child: Manifest) -> None:
        """Delete `child` (the object of its uid: one replaced since is left), and note it."""
        self._kube.delete(child)
        self._write(done, child, "Deleted")

    def _created(
        self,
        owner: Owner,
        done: list[EventNote],
        write: ChildWrite,
        made: list[Manifest] | None,
    ) -> Manifest:
        """Create `write`'s child; applied instead onto one of this service found in its place.

        The child created (not one applied onto) is added to `made`, where given. A refused
        create is looked into as its dry-run is (`_checked`): the refusal may hide a name
        held by another's object.

        Raises:
            ChildConflict: the name is taken by an object this service does not control.
            ChildRefused: the API server refused the child, and no object holds its name.
        """
        try:
            created = self._kube.create(write.manifest)
        except ChildConflict:
            found = self._taken_by_ours(owner, write.manifest)
        except ChildRefused:
            seen = self._found(owner, write.manifest)
            if seen is None:
                raise
            found = seen
        else:
            self._write(done, write.manifest, "Created")
            if made is not None:
                made.append(created)
            return created
        applied = self._kube.apply(write.manifest, current=found)
        self._write(done, write.manifest, "Updated")
        return applied

    def _write(self, done: list[EventNote], child: Manifest, action: str) -> None:
        """Count a write made, and note it in `done` ("Created", "Updated", "Deleted").

        `done` is shared by the steps of a phase, made at once: `list.append` is atomic.
        """
        self._metrics.writes.labels(child["kind"], action.lower()).inc()
        done.append(EventNote("Normal", action, f"{action} {_named(child)}"))


def _in_phases(items: Sequence[S], phase_of: Callable[[S], int]) -> list[list[S]]:
    """`items` grouped by `phase_of`, lowest phase first, each group in the order given."""
    phases: dict[int, list[S]] = {}
    for item in items:
        phases.setdefault(phase_of(item), []).append(item)
    return [phases[phase] for phase in sorted(phases)]


def _named(child: Manifest) -> str:
    """A child as Events and logs name it: its kind and name."""
    return " ".join(render.child_key(child))


def _after_pods(child: Manifest) -> bool:
    """Whether a first create makes `child` after the Deployments (a scaler).

    Such a child is dry-run first: refused at its create, it would be undone once pods had
    started.
    """
    return render.first_create_phase(child) > render.PODS_PHASE


def _phase(step: ChildWrite | Manifest) -> int:
    if isinstance(step, ChildWrite):
        return render.converge_phase(step.manifest, step.current)
    return render.converge_phase(step, step, stale=True)
