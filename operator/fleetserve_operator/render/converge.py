"""Pure: how the desired children meet the observed ones.

Which observed child is the operator's (its controller reference, never its labels), which
drifted and must be written (`needs_write`), which are stale, and in which order a converge
writes and deletes them so that a route never names what is not there (`converge_phase`).
"""

from __future__ import annotations

from typing import Any

from fleetserve_operator import naming
from fleetserve_operator.records import Manifest
from fleetserve_operator.render.owner import Owner

__all__ = [
    "PODS_PHASE",
    "child_key",
    "converge_phase",
    "first_create_phase",
    "is_controlled_by",
    "is_drifted",
    "needs_write",
    "stale_children",
]


def child_key(manifest: Manifest) -> tuple[str, str]:
    """(kind, name): what identifies a child within its namespace."""
    return manifest["kind"], manifest["metadata"]["name"]


def is_drifted(desired: Any, observed: Any) -> bool:
    """True when `observed` lacks or changed a field of `desired` (extra fields are fine)."""
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return True
        return any(is_drifted(value, observed.get(key)) for key, value in desired.items())
    if isinstance(desired, list):
        if not isinstance(observed, list) or len(desired) != len(observed):
            return True
        return any(is_drifted(d, o) for d, o in zip(desired, observed, strict=True))
    # Quantities come back as strings ("2" for 2); compare them as the API prints them.
    return str(desired) != str(observed)


def is_controlled_by(owner: Owner, obj: Manifest) -> bool:
    """True when `obj` carries `owner`'s controller reference (labels alone prove nothing)."""
    return any(
        ref.get("uid") == owner.uid and ref.get("controller") is True
        for ref in obj["metadata"].get("ownerReferences") or []
    )


def _has_operator_fields(obj: Manifest) -> bool:
    """True when the operator's field manager owns fields of `obj` (by apply, or its create)."""
    return any(
        entry.get("manager") == naming.MANAGER
        for entry in obj["metadata"].get("managedFields") or []
    )


def needs_write(desired: Manifest, observed: Manifest) -> bool:
    """True when `observed` drifted from `desired`, or the operator owns none of its fields.

    The latter is a child another manager took over (a forced apply of the same values):
    applied again, the operator owns what it renders. A child it created and never applied
    onto (its fields owned by the create's `Update` entry) needs no write for that: the
    first apply takes them over (`KubeApi.apply`).
    """
    return is_drifted(desired, observed) or not _has_operator_fields(observed)


_ROUTE_KINDS = frozenset({"HTTPRoute", "GRPCRoute"})


def _drops_port(desired: Manifest, current: Manifest | None) -> bool:
    """True when `desired` applied over the Service `current` takes away one of its ports."""
    if current is None or desired["kind"] != "Service":
        return False
    kept = {port["port"] for port in desired["spec"]["ports"]}
    return any(port.get("port") not in kept for port in current["spec"].get("ports") or [])


def converge_phase(child: Manifest, current: Manifest | None, *, stale: bool = False) -> int:
    """When a converge writes `child` over `current`, or deletes it (`stale`): lowest first.

    A route may only name what is there, at every moment and whichever write the operator
    dies after: whatever a route is about to name is written before the routes (0), and
    whatever routes stop naming is changed or removed after them (3, 4). So a promotion
    moves the routes to the stable track before the canary goes, and a Service loses a
    port (the GRPCRoute's, when a version stops serving gRPC) only once no route names it.

    0: creates and applies that add or keep (Deployments, Services keeping every port,
    scalers, budgets); 1: routes written; 2: routes deleted; 3: Services losing a port;
    4: every other deletion.
    """
    route = child["kind"] in _ROUTE_KINDS
    if stale:
        return 2 if route else 4
    if route:
        return 1
    return 3 if _drops_port(child, current) else 0


PODS_PHASE = 2
"""`first_create_phase` of the Deployments: the first write that sets pods going."""
_FIRST_CREATE_PHASES = {
    **dict.fromkeys(_ROUTE_KINDS, 1),
    "Deployment": PODS_PHASE,
    "ScaledObject": 3,
}


def first_create_phase(child: Manifest) -> int:
    """When a service's first create, made without dry-runs, creates `child`: lowest first.

    Such a create is undone when a child is refused, so the Deployments, whose pods are the
    one thing a create sets going, come after every child that could still be refused: a
    refusal there is undone before any pod exists. Routes name only Services, made before
    them. A scaler names its Deployment and comes after it (`PODS_PHASE`): the writer
    dry-runs such children before anything is created.

    0: Services, budgets, ConfigMaps (every kind not named here); 1: routes; 2: Deployments;
    3: scalers.
    """
    return _FIRST_CREATE_PHASES.get(child["kind"], 0)


def stale_children(
    owner: Owner, desired: list[Manifest], observed: list[Manifest]
) -> list[Manifest]:
    """Observed children this owner controls that are no longer desired (e.g. fallback off)."""
    wanted = {child_key(child) for child in desired}
    return [
        child
        for child in observed
        if child_key(child) not in wanted and is_controlled_by(owner, child)
    ]
