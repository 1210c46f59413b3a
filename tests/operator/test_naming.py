"""Derived names and labels stay within Kubernetes' limits for every legal InferenceService."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator import naming
from fleetserve_operator.naming import Track
from fleetserve_operator.render import Owner, desired_children
from fleetserve_operator.spec import (
    InferenceServiceStatus,
    ModelSpec,
    RolloutPhase,
    RolloutStatus,
)
from fleetserve_operator.testing import make_spec

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LONGEST = "n" * naming.MAX_NAME_LENGTH


def _every_child(name: str, version: str = "1") -> list[dict[str, Any]]:
    """Every child of a service in the middle of a rollout, with fallback and HTTPRoute."""
    model = {"name": "m", "version": version, "uri": "builtin://synthetic"}
    stable = make_spec(model=model)
    spec = make_spec(
        model={**model, "version": "next"},
        fallback={"enabled": True},
        traffic={"provider": "gateway-api", "parentRefs": [{"name": "gw"}]},
    )
    status = InferenceServiceStatus(
        phase=RolloutPhase.PROGRESSING,
        rollout=RolloutStatus(stable_spec=stable.gpu_track),
    )
    return desired_children(Owner(name=name, namespace="ns", uid="u"), spec, status)


def _labels(child: dict[str, Any]) -> dict[str, str]:
    labels = dict(child["metadata"]["labels"])
    if child["kind"] == "Deployment":
        labels |= child["spec"]["template"]["metadata"]["labels"]
        labels |= child["spec"]["selector"]["matchLabels"]
    elif child["kind"] == "Service":
        labels |= child["spec"]["selector"]
    return labels


def test_longest_name_gives_dns_1035_children_on_every_track() -> None:
    """At MAX_NAME_LENGTH every child (all three tracks) is a Service-legal name."""
    children = _every_child(LONGEST)
    names = {child["metadata"]["name"] for child in children}
    assert {naming.child_name(LONGEST, track) for track in Track} <= names
    for name in names:
        assert len(name) <= 63, name
        assert DNS_1035.match(name), name
    assert len(naming.child_name(LONGEST + "n", Track.FALLBACK)) == 64


@pytest.mark.parametrize("version", ["1", "2024.01.31", "v1.2.3-rc.1", "A_b", "x" * 63])
def test_every_label_value_is_legal(version: str) -> None:
    """Label and selector values (instance, track, pool, model version, hash) are legal."""
    for child in _every_child(LONGEST, version):
        for key, value in _labels(child).items():
            assert len(value) <= 63, (key, value)
            assert LABEL_VALUE.match(value), (key, value)


@pytest.mark.parametrize("version", ["1.0+build", "v1-", "-v1", "x" * 64, "a b"])
def test_versions_that_are_no_label_value_are_refused(version: str) -> None:
    """`model.version` becomes a label value, so the spec refuses anything else."""
    with pytest.raises(ValidationError, match="version"):
        ModelSpec(name="m", version=version, uri="builtin://synthetic")
