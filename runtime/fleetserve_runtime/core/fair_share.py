"""Weighted fair share between tenants: self-clocked fair queueing tags (pure).

Both engines' waiting queues order requests of one effective priority class by the tag
`FairShare.tag` gives them, lowest first. A tenant's tag advances by `cost / weight` per
request (cost: tokens), starting from the later of its own last tag and the queue's
virtual clock, which `served` moves to the tag of each request taken out of the queue.
So a tenant that queues ten times the tokens of another gets its tags ten times as far
ahead, and a quiet tenant's new request sorts next to the work being served now instead of
behind the noisy tenant's backlog; with equal load every tenant gets tokens in proportion
to its weight. Requests with no tenant share one default tenant (`DEFAULT_TENANT`).

`effective_class` is how fairness keeps priority classes and aging: a request's class is
its priority raised one class per aging period waited, which (as every request ages at
the same rate) is fixed at arrival as `floor(priority + arrived_at / aging_s)`. Fairness
orders requests within one such class only; a request of a better class still goes first.

Pure: no clock, no threads; one instance per queue, touched by that queue's owner only.
"""

from __future__ import annotations

import math

from fleetserve_runtime.core.priority import Priority

__all__ = ["DEFAULT_TENANT", "FairShare", "effective_class"]

DEFAULT_TENANT = "_default"
"""The tenant of requests that bear no tenant's token (not a DNS label, so no table name
can equal it); also its metrics label."""


def effective_class(priority: Priority, arrived_at: float, aging_s: float) -> float:
    """The class a request competes in: `priority` aged at arrival, floored to a whole class.

    Time-invariant, like `core.queueing.aged_priority` at a fixed `now` of 0; `aging_s` 0
    (or less) disables aging and leaves the class as it was asked.
    """
    if aging_s <= 0:
        return float(priority)
    return float(math.floor(priority + arrived_at / aging_s))


class FairShare:
    """Self-clocked fair queueing tags for one queue; see the module docstring."""

    def __init__(self) -> None:
        self._clock = 0.0
        self._last: dict[str, float] = {}

    @property
    def clock(self) -> float:
        """The virtual clock: the tag of the latest request served."""
        return self._clock

    def tag(self, tenant: str, cost: float, weight: float) -> float:
        """The finish tag of a new request of `tenant` costing `cost` (tokens); lower first.

        `ValueError` for a weight that is not positive (the tenants table forbids it).
        """
        if weight <= 0:
            msg = f"a tenant's weight must be positive, got {weight}"
            raise ValueError(msg)
        start = max(self._clock, self._last.get(tenant, 0.0))
        finish = start + max(cost, 1.0) / weight
        self._last[tenant] = finish
        return finish

    def served(self, tag: float) -> None:
        """A request with `tag` left the queue to run: the virtual clock moves up to it."""
        self._clock = max(self._clock, tag)
        if len(self._last) > 1024:
            # Tenants whose last tag the clock has passed start from the clock anyway.
            self._last = {name: last for name, last in self._last.items() if last > self._clock}
