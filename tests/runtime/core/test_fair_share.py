"""Weighted fair-share tags: a noisy tenant waits behind its own backlog, weights divide."""

from __future__ import annotations

import pytest

from fleetserve_runtime.core.fair_share import FairShare, effective_class
from fleetserve_runtime.core.priority import Priority


def drain(fair: FairShare, queued: list[tuple[float, str]]) -> list[str]:
    """Serve `queued` (tag, tenant) lowest tag first, as a queue does; the tenants in order."""
    order = []
    for tag, tenant in sorted(queued):
        fair.served(tag)
        order.append(tenant)
    return order


def test_a_quiet_tenant_goes_before_a_noisy_tenants_backlog() -> None:
    fair = FairShare()
    queued = [(fair.tag("noisy", 10, 1.0), "noisy") for _ in range(10)]
    queued.append((fair.tag("quiet", 10, 1.0), "quiet"))
    assert drain(fair, queued)[:2] == ["noisy", "quiet"]


def test_a_tenant_arriving_later_starts_at_the_virtual_clock_not_at_zero() -> None:
    """Served work moves the clock: an idle tenant cannot bank credit and then flood."""
    fair = FairShare()
    for _ in range(5):
        fair.served(fair.tag("a", 10, 1.0))
    assert fair.tag("b", 10, 1.0) == pytest.approx(fair.clock + 10)


def test_weights_divide_the_service_in_proportion() -> None:
    fair = FairShare()
    queued = [(fair.tag("heavy", 10, 3.0), "heavy") for _ in range(30)]
    queued += [(fair.tag("light", 10, 1.0), "light") for _ in range(30)]
    first = drain(fair, queued)[:40]
    assert first.count("heavy") == 30
    assert first.count("light") == 10


def test_cost_counts_tokens_so_long_requests_cost_more() -> None:
    fair = FairShare()
    long_tag = fair.tag("long", 1000, 1.0)
    short_tags = [fair.tag("short", 10, 1.0) for _ in range(50)]
    assert max(short_tags) < long_tag


def test_a_weight_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        FairShare().tag("a", 1, 0.0)


def test_effective_class_is_the_aged_priority_floored_and_time_invariant() -> None:
    assert effective_class(Priority.NORMAL, 0.0, 1.0) == 1.0
    assert effective_class(Priority.NORMAL, 0.5, 1.0) == 1.0
    # A low request that arrived a class-period earlier competes with a normal one now.
    assert effective_class(Priority.LOW, 0.0, 1.0) == effective_class(Priority.NORMAL, 1.2, 1.0)
    assert effective_class(Priority.HIGH, 0.9, 1.0) < effective_class(Priority.NORMAL, 0.9, 1.0)
    assert effective_class(Priority.LOW, 123.0, 0.0) == 2.0
