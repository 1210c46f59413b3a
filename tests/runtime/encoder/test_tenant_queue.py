"""Tenants in the encoder's queue: fair share within a class, FIFO without tenants.

The batcher takes a quiet tenant's item before a noisy tenant's backlog of the same class.
"""

from __future__ import annotations

from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.tenants import Tenant
from fleetserve_runtime.encoder.batcher import BatchLimits, plan_batch
from fleetserve_runtime.encoder.request_queue import RequestQueue
from fleetserve_runtime.testing import make_items

NOISY, QUIET = Tenant("noisy"), Tenant("quiet")
LIMITS = BatchLimits(
    max_batch_size=2, max_queue_delay_s=0.0, max_batch_tokens=0, aging_s=0.2,
    lower_class_share=0.0,
)  # fmt: skip


def push(queue: RequestQueue, tenant: Tenant | None, *, now: float, name: str) -> None:
    (item,) = make_items([8], now=now)
    item.tenant = tenant
    item.payload = name
    queue.push([item])


def batches(queue: RequestQueue, now: float) -> list[list[str]]:
    taken = []
    while len(queue):
        batch = plan_batch(queue, now, LIMITS).batch
        assert batch is not None
        taken.append([item.payload for item in batch.items])
    return taken


def test_a_quiet_tenant_rides_in_the_first_batch_ahead_of_the_noisy_backlog() -> None:
    queue: RequestQueue = RequestQueue(max_size=100, retry_after_s=1, aging_s=0.2)
    for n in range(10):
        push(queue, NOISY, now=0.001 * n, name=f"noisy{n}")
    push(queue, QUIET, now=0.011, name="quiet")
    first = batches(queue, now=0.02)[0]
    assert "quiet" in first, first


def test_weights_give_a_heavier_tenant_more_of_each_batch() -> None:
    heavy, light = Tenant("heavy", weight=3.0), Tenant("light")
    queue: RequestQueue = RequestQueue(max_size=100, retry_after_s=1, aging_s=0.2)
    for _ in range(8):
        push(queue, light, now=0.0, name="light")
        push(queue, heavy, now=0.0, name="heavy")
    served = [name for batch in batches(queue, now=0.001)[:4] for name in batch]
    assert served.count("heavy") == 6


def test_without_tenants_items_are_taken_first_come_first_served() -> None:
    queue: RequestQueue = RequestQueue(max_size=100, retry_after_s=1, aging_s=0.2)
    for n in range(5):
        push(queue, None, now=0.001 * n, name=f"n{n}")
    assert batches(queue, now=0.01) == [["n0", "n1"], ["n2", "n3"], ["n4"]]


def test_a_tenants_items_keep_their_class_order() -> None:
    queue: RequestQueue = RequestQueue(max_size=100, retry_after_s=1, aging_s=0.2)
    for n in range(3):
        push(queue, NOISY, now=0.0, name=f"noisy{n}")
    (urgent,) = make_items([8], now=0.0, priority=Priority.HIGH)
    urgent.tenant, urgent.payload = QUIET, "urgent"
    queue.push([urgent])
    assert batches(queue, now=0.001)[0][0] == "urgent"
