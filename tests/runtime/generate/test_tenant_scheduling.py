"""Tenants in the generative scheduler: fair share within a class, classes and aging kept.

Prefix-cache blocks are never shared across tenants.
"""

from __future__ import annotations

from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.tenants import Tenant
from fleetserve_runtime.generate.blocks import BlockPool, salt_root
from fleetserve_runtime.generate.scheduler import Scheduler, SchedulerLimits
from fleetserve_runtime.generate.sequence import Seq

NOISY, QUIET = Tenant("noisy"), Tenant("quiet")


def scheduler(*, aging_s: float = 0.0, max_running: int = 1) -> Scheduler:
    pool = BlockPool(256, 4, prefix_caching=True)
    return Scheduler(pool, SchedulerLimits(max_running, 64, aging_s))


def queue(
    sched: Scheduler,
    seq_id: int,
    tenant: Tenant | None,
    *,
    at: float = 0.0,
    priority: Priority = Priority.NORMAL,
    prompt: list[int] | None = None,
) -> Seq:
    tokens = prompt if prompt is not None else [seq_id % 50 + 1] * 8
    root = salt_root(None, None if tenant is None else tenant.name)
    seq = Seq(
        seq_id, list(tokens), len(tokens), priority=priority, arrived_at=at, tenant=tenant,
        cache_root=root,
    )  # fmt: skip
    sched.add(seq)
    return seq


def admitted_order(sched: Scheduler) -> list[int]:
    """Seq ids in the order the scheduler admits them, one at a time, each run to its end."""
    order = []
    while sched.num_waiting:
        plan = sched.schedule()
        for seq in plan.admitted:
            order.append(seq.seq_id)
            sched.finish(seq)
    return order


def test_a_quiet_tenant_is_admitted_before_a_noisy_tenants_backlog() -> None:
    sched = scheduler()
    for n in range(10):
        queue(sched, n, NOISY, at=n * 0.001)
    queue(sched, 99, QUIET, at=0.02)
    order = admitted_order(sched)
    assert order.index(99) <= 1, order


def test_without_tenants_the_queue_is_first_come_first_served() -> None:
    sched = scheduler()
    for n in range(10):
        queue(sched, n, None, at=n * 0.001)
    queue(sched, 99, None, at=0.02)
    assert admitted_order(sched) == [*range(10), 99]


def test_a_better_class_still_goes_first_and_fairness_stays_within_a_class() -> None:
    sched = scheduler(aging_s=10.0)
    queue(sched, 1, QUIET, priority=Priority.LOW)
    for n in range(2, 6):
        queue(sched, n, NOISY, priority=Priority.HIGH)
    assert admitted_order(sched) == [2, 3, 4, 5, 1]


def test_aging_still_raises_a_long_waiting_class() -> None:
    """A low request that waited two aging periods competes with normal ones, and wins by age."""
    sched = scheduler(aging_s=1.0)
    queue(sched, 1, QUIET, priority=Priority.LOW, at=0.0)
    for n in range(2, 6):
        queue(sched, n, NOISY, priority=Priority.NORMAL, at=2.5)
    assert admitted_order(sched)[0] == 1


def test_tenants_never_share_prefix_cache_blocks() -> None:
    sched = scheduler(max_running=4)
    prompt = list(range(1, 17))
    first = queue(sched, 1, QUIET, prompt=prompt)
    plan = sched.schedule()
    sched.commit(plan, [7])
    sched.finish(first)
    assert first.num_computed == len(prompt)
    same = queue(sched, 2, QUIET, prompt=prompt)
    other = queue(sched, 3, NOISY, prompt=prompt)
    untenanted = queue(sched, 4, None, prompt=prompt)
    assert len(sched.kv.cached_prefix(same)) > 0
    assert sched.kv.cached_prefix(other) == []
    assert sched.kv.cached_prefix(untenanted) == []
