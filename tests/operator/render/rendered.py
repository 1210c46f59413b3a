"""The render tests' owner, the children it renders for a spec by (kind, name), and flags."""

from __future__ import annotations

from typing import Any

from fleetserve_operator.records import Manifest
from fleetserve_operator.render import Owner, child_key, desired_children
from fleetserve_operator.spec import InferenceServiceSpec, InferenceServiceStatus

OWNER = Owner(name="demo", namespace="ns", uid="uid-1")


def children_by_key(
    spec: InferenceServiceSpec, status: InferenceServiceStatus | None = None, **options: Any
) -> dict[tuple[str, str], Manifest]:
    """What `desired_children` renders for `spec` under `OWNER` (a fresh status when None)."""
    rendered = desired_children(OWNER, spec, status or InferenceServiceStatus(), **options)
    return {child_key(child): child for child in rendered}


def flag_value(args: list[str], flag: str) -> str:
    """The value after `flag` in a container's `args`."""
    return args[args.index(flag) + 1]
