"""Who may raise priority and deadline: the pure decision both HTTP surfaces take."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_runtime.core.errors import Forbidden, InvalidInput
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.serving.admission import Scheduling, scheduling

DEFAULT_MS = 5_000


def decide(*, privileged: bool = False, **asked: Any) -> Scheduling:
    fields: dict[str, Any] = {
        "priority_header": None,
        "timeout_header": None,
        "priority": None,
        "timeout_ms": None,
    }
    fields.update(asked)
    return scheduling(**fields, default_timeout_ms=DEFAULT_MS, privileged=privileged)


def test_nothing_asked_is_normal_priority_and_the_default_deadline() -> None:
    assert decide() == Scheduling(Priority.NORMAL, None)


@pytest.mark.parametrize(
    ("asked", "named"),
    [
        pytest.param({"priority_header": "high"}, "x-fleetserve-priority high", id="header"),
        pytest.param({"priority": "HIGH"}, "parameters.priority high", id="body"),
        pytest.param(
            {"timeout_header": str(DEFAULT_MS + 1)}, "x-fleetserve-timeout-ms 5001", id="timeout"
        ),
        pytest.param({"timeout_ms": 600_000}, "parameters.timeout_ms 600000", id="body-timeout"),
        pytest.param(
            {"priority_header": "high", "priority": "low"},
            "x-fleetserve-priority",
            id="header-wins",
        ),
    ],
)
def test_raising_needs_the_priority_token(asked: dict[str, Any], named: str) -> None:
    """Above normal or the default deadline: refused naming where it was asked, unless granted."""
    with pytest.raises(Forbidden, match="priority token") as refused:
        decide(**asked)
    assert named in refused.value.message
    granted = decide(privileged=True, **asked)
    assert granted.priority == Priority.HIGH or granted.timeout_ms is not None


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        pytest.param({"priority_header": "low"}, Scheduling(Priority.LOW, None), id="low"),
        pytest.param({"priority": "normal"}, Scheduling(Priority.NORMAL, None), id="normal"),
        pytest.param({"timeout_header": "10"}, Scheduling(Priority.NORMAL, 10), id="shorter"),
        pytest.param({"timeout_ms": DEFAULT_MS}, Scheduling(Priority.NORMAL, DEFAULT_MS), id="eq"),
        pytest.param(
            {"priority_header": "low", "priority": "high"},
            Scheduling(Priority.LOW, None),
            id="header-lowers-the-body",
        ),
    ],
)
def test_lowering_is_open_to_every_caller(asked: dict[str, Any], expected: Scheduling) -> None:
    assert decide(**asked) == expected


@pytest.mark.parametrize(
    ("asked", "named"),
    [
        pytest.param({"priority_header": "urgent"}, "x-fleetserve-priority", id="priority"),
        pytest.param({"priority": "urgent"}, "parameters.priority", id="body-priority"),
        pytest.param({"timeout_header": "-5"}, "x-fleetserve-timeout-ms", id="timeout"),
    ],
)
def test_values_that_do_not_parse_are_invalid_even_with_the_token(
    asked: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidInput, match=named):
        decide(privileged=True, **asked)
