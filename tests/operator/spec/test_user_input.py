"""Every parse of user input is total: a hostile value becomes an InvalidSpec naming its field.

The CRD refuses these values at the API server; an object stored under an older CRD (or a
value the schema cannot bound) still reaches the operator, which must report it once, in a
bounded status, and create nothing: never a traceback, never a retry loop.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import InvalidSpec
from fleetserve_operator.spec import MAX_QUANTITY, parse_quantity
from fleetserve_operator.testing import FakeKube, make_service

NOW = datetime(2025, 1, 1, tzinfo=UTC)
MODEL = {"name": "demo", "version": "1", "uri": "builtin://synthetic"}
MIB = 2**20
GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gateway"}]}


def _spec(**sections: Any) -> dict[str, Any]:
    return {"model": MODEL, **sections}


HOSTILE = [
    pytest.param("spec.memory.budget", _spec(memory={"budget": "1e99999"}), id="budget-exponent"),
    pytest.param("spec.memory.budget", _spec(memory={"budget": "9" * 5000}), id="budget-digits"),
    pytest.param("spec.memory.budget", _spec(memory={"budget": 10**30}), id="budget-int"),
    pytest.param("spec.memory.budget", _spec(memory={"budget": "8Ei"}), id="budget-above-int64"),
    pytest.param("spec.runtime.resources.requests",
                 _spec(runtime={"resources": {"requests": {"memory": "1e99999"}}}),
                 id="request-exponent"),
    pytest.param("spec.runtime.resources.limits",
                 _spec(runtime={"resources": {"limits": {"nvidia.com/gpu": "1e400"}}}),
                 id="gpu-limit-exponent"),
    pytest.param("spec.fallback.resources.requests",
                 _spec(fallback={"enabled": True, "resources": {"requests": {"cpu": "1e99999"}}}),
                 id="fallback-request-exponent"),
    pytest.param("spec.rollout.interval", _spec(rollout={"interval": "9" * 30 + "h"}),
                 id="interval-overflows-a-datetime"),
    pytest.param("spec.model.uri",
                 _spec(model={**MODEL, "uri": "builtin://synthetic?" + "x" * MIB}),
                 id="uri-1MiB"),
    pytest.param("spec.model.version", _spec(model={**MODEL, "version": "1.0+build"}),
                 id="version-not-a-label-value"),
    pytest.param("spec.runtime.env",
                 _spec(runtime={"env": [{"name": "BLOB", "value": "x" * MIB}]}), id="env-1MiB"),
    pytest.param("spec.traffic.hostnames", _spec(traffic={**GATEWAY, "hostnames": ["a" * MIB]}),
                 id="hostname-1MiB"),
    pytest.param("spec.runtime.nodeSelector",
                 _spec(runtime={"nodeSelector": {"pool": "x" * MIB}}), id="label-value-1MiB"),
    pytest.param("spec.batching.buckets", _spec(batching={"buckets": "1" + "0" * 5000}),
                 id="bucket-edge-digits"),
    pytest.param("spec.runtime.nodeSelector.",
                 _spec(runtime={"nodeSelector": {"k" * MIB: "v"}}), id="label-key-1MiB"),
    pytest.param("spec.runtime.resources.limits.",
                 _spec(runtime={"resources": {"limits": {"k" * MIB: "1"}}}),
                 id="resource-name-1MiB"),
    pytest.param("spec.model.", _spec(model={**MODEL, "k" * MIB: "1"}), id="unknown-field-1MiB"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "spec"), HOSTILE)
def test_hostile_value_is_reported_naming_the_field(field: str, spec: dict[str, Any]) -> None:
    """One reconcile: InvalidSpec naming the field, Degraded, a bounded message, no child."""
    kube = FakeKube()
    kube.add_service(make_service(spec))
    sync = Sync(kube, metrics=OperatorMetrics(), clock=lambda: NOW)

    error = sync.run_by_name("ns", "demo", trigger="create")

    assert isinstance(error, InvalidSpec)
    assert error.field.startswith(field), error.field[:100]
    assert len(error.field) <= 256
    assert [action for action, _, _ in kube.writes] == ["status"], kube.writes
    status = kube.status_of("ns", "demo")
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "InvalidSpec")
    assert status.last_error is not None
    assert field in status.last_error
    assert len(status.last_error) <= 1024
    assert all(len(event.message) <= 1024 for event in kube.events)


def test_an_error_message_is_bounded_whatever_it_quotes() -> None:
    """A field and message of any length make an error of at most 1024 characters."""
    error = InvalidSpec("spec.model.uri", "x" * MIB)
    assert str(error).startswith("spec.model.uri: xxx")
    assert len(str(error)) == 1024


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("8Ei", None, id="2^63-is-too-large"),
        pytest.param("7Ei", 7 * 2**60, id="7Ei"),
        pytest.param("1E", 10**18, id="decimal-exa-unit"),
        pytest.param("1e18", 10**18, id="exponent"),
        pytest.param("9223372036854775807", MAX_QUANTITY, id="largest"),
        pytest.param("9223372036854775808", None, id="largest-plus-one"),
        pytest.param("0e99", 0, id="zero-times-anything"),
        pytest.param("1e99", None, id="two-digit-exponent-too-large"),
        pytest.param("1e100", None, id="three-digit-exponent"),
        pytest.param("1" * 65, None, id="longer-than-64"),
        pytest.param(-1, None, id="negative-int"),
    ],
)
def test_quantity_bounds(value: int | str, expected: int | None) -> None:
    """Quantities are exact up to 2^63-1 and refused (ValueError) beyond, whatever their size."""
    if expected is None:
        with pytest.raises(ValueError, match="quantity"):
            parse_quantity(value)
    else:
        assert parse_quantity(value) == expected
