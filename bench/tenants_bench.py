"""A noisy tenant against a quiet one on one generative engine (target: quiet p99 ratio <= 1.5).

The generative `Scheduler` and its `BlockPool` run as the engine runs them, stepped on a
simulated clock by a model whose step costs `step_ms` plus `token_us` per token computed (a
decode step is bound by reading the weights, whatever the batch), so the run is exact,
repeatable and takes seconds on two cores. Arrivals are Poisson: the quiet tenant sends
`quiet_rate` requests per second, the noisy one `noise_factor` times as many, more than the
engine can serve. Four configurations side by side in one run:

* `quiet alone`: the quiet tenant's latency with nobody else (the reference);
* `no tenants`: both through today's first-come queue (bounded by `queue_size`: 503s);
* `fair share`: a tenants table with weights, no quota (fair tags within a class);
* `fair + quota`: the same with the noisy tenant's `max_requests` (half the engine's running
  sequences), its excess refused (429).

Without a quota the noisy tenant fills the queue's shared bound, and the quiet tenant's
requests are refused at the door (503) or queued behind a backlog older than an aging
period, which fair share does not reorder (aging keeps its meaning); the quota is what keeps
that backlog from forming, and fair share orders what is left.

The quiet tenant's p99 latency (arrival to last token) under noise, over its p99 alone, is
the figure; the last line is the headline, `quiet_p99_ratio=<fair + quota ratio>`.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetserve_runtime.core.errors import QueueFull, TenantOverQuota
from fleetserve_runtime.core.queueing import QueueBound
from fleetserve_runtime.core.tenants import Tenant, TenantLoad
from fleetserve_runtime.generate.blocks import BlockPool, salt_root
from fleetserve_runtime.generate.scheduler import Scheduler, SchedulerLimits
from fleetserve_runtime.generate.sequence import Seq

QUIET, NOISY = "quiet", "noisy"


@dataclass(frozen=True, slots=True)
class TenantWorkload:
    """Who sends what, for how long."""

    duration_s: float = 60.0
    quiet_rate: float = 6.0
    """Quiet requests per second; the noisy tenant sends `noise_factor` times as many."""
    noise_factor: float = 10.0
    prompt_tokens: int = 64
    output_tokens: int = 24
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Engine:
    """The engine's limits and the simulated model's step cost."""

    max_running: int = 8
    max_step_tokens: int = 512
    num_blocks: int = 1024
    block_size: int = 16
    queue_size: int = 256
    aging_s: float = 5.0
    step_ms: float = 10.0
    token_us: float = 20.0
    noisy_max_requests: int = 4


@dataclass(slots=True)
class TenantOutcome:
    """Latencies (seconds) of the finished requests and refusals, by tenant."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {QUIET: [], NOISY: []})
    refused: Counter[tuple[str, int]] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class Config:
    """One column of the table."""

    name: str
    noisy: bool
    tenants: bool
    quota: bool


CONFIGS = (
    Config("quiet alone", noisy=False, tenants=False, quota=False),
    Config("no tenants", noisy=True, tenants=False, quota=False),
    Config("fair share", noisy=True, tenants=True, quota=False),
    Config("fair + quota", noisy=True, tenants=True, quota=True),
)


def arrivals(workload: TenantWorkload, *, noisy: bool) -> list[tuple[float, str]]:
    """(time, tenant) of every request, Poisson per tenant, in time order."""
    rng = random.Random(workload.seed)
    rates = {QUIET: workload.quiet_rate}
    if noisy:
        rates[NOISY] = workload.quiet_rate * workload.noise_factor
    events: list[tuple[float, str]] = []
    for name, rate in rates.items():
        now = rng.expovariate(rate)
        while now < workload.duration_s:
            events.append((now, name))
            now += rng.expovariate(rate)
    return sorted(events)


def simulate(workload: TenantWorkload, engine: Engine, config: Config) -> TenantOutcome:
    """Step the scheduler through the workload on a simulated clock."""
    rng = random.Random(workload.seed + 1)
    pool = BlockPool(engine.num_blocks, engine.block_size, prefix_caching=True)
    scheduler = Scheduler(
        pool, SchedulerLimits(engine.max_running, engine.max_step_tokens, engine.aging_s)
    )
    tenants = {
        QUIET: Tenant(QUIET, weight=1.0),
        NOISY: Tenant(
            NOISY, weight=1.0, max_requests=engine.noisy_max_requests if config.quota else None
        ),
    }
    bound, load = QueueBound(engine.queue_size, 1.0), TenantLoad(1.0)
    pending = arrivals(workload, noisy=config.noisy)
    outcome, owner = TenantOutcome(), {}
    now, next_id, index = 0.0, 0, 0
    while index < len(pending) or scheduler.num_running or scheduler.num_waiting:
        if not (scheduler.num_running or scheduler.num_waiting):
            now = max(now, pending[index][0])
        while index < len(pending) and pending[index][0] <= now:
            at, name = pending[index]
            index += 1
            tenant = tenants[name] if config.tenants else None
            try:
                bound.check(scheduler.num_waiting)
                if tenant is not None:
                    load.enter(tenant)
            except QueueFull as exc:
                code = 429 if isinstance(exc, TenantOverQuota) else 503
                outcome.refused[(name, code)] += 1
                continue
            prompt = [rng.randrange(1, 30_000) for _ in range(workload.prompt_tokens)]
            seq = Seq(
                next_id, prompt, len(prompt), arrived_at=at, tenant=tenant,
                cache_root=salt_root(None, None if tenant is None else name),
                fair_cost=len(prompt) + workload.output_tokens,
            )  # fmt: skip
            owner[next_id] = (name, tenant)
            next_id += 1
            scheduler.add(seq)
        plan = scheduler.schedule()
        now += (engine.step_ms + engine.token_us * plan.num_tokens / 1000) / 1000
        scheduler.commit(plan, [1 if chunk.samples else None for chunk in plan.chunks])
        for chunk in plan.chunks:
            seq = chunk.seq
            if len(seq.tokens) - seq.prompt_len >= workload.output_tokens:
                scheduler.finish(seq)
                name, tenant = owner.pop(seq.seq_id)
                if tenant is not None:
                    load.leave(tenant)
                outcome.latencies[name].append(now - seq.arrived_at)
    return outcome


def p99(values: Sequence[float]) -> float:
    """The 99th percentile (nearest rank); NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def report(workload: TenantWorkload, engine: Engine) -> float:
    """Run every configuration, print the table, return the fair + quota ratio."""
    results = {config.name: simulate(workload, engine, config) for config in CONFIGS}
    alone = p99(results["quiet alone"].latencies[QUIET])
    print(
        f"one engine, {engine.max_running} sequences, {engine.step_ms:g} ms/step; quiet "
        f"{workload.quiet_rate:g} req/s, noisy {workload.noise_factor:g}x, "
        f"{workload.duration_s:g} s simulated"
    )
    header = f"{'quiet p99 ms':>14}{'ratio':>8}{'quiet done':>12}{'noisy done':>12}"
    print(f"{'config':<14}{header}  refused")
    ratio = math.nan
    for config in CONFIGS:
        outcome = results[config.name]
        quiet = p99(outcome.latencies[QUIET])
        ratio = quiet / alone
        refused = ", ".join(
            f"{name} {code} x{count}" for (name, code), count in sorted(outcome.refused.items())
        )
        print(
            f"{config.name:<14}{quiet * 1000:>14.1f}{ratio:>8.2f}"
            f"{len(outcome.latencies[QUIET]):>12}{len(outcome.latencies[NOISY]):>12}"
            f"  {refused or 'none'}"
        )
    quota = results["fair + quota"].refused
    got_429 = sorted({name for (name, code) in quota if code == 429})
    print(f"quiet p99 alone {alone * 1000:.1f} ms; 429s went to: {', '.join(got_429) or 'nobody'}")
    return ratio


def main(argv: Sequence[str] | None = None) -> None:
    """Run the four configurations and print them, headline last."""
    default = TenantWorkload()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=default.duration_s)
    parser.add_argument("--quiet-rate", type=float, default=default.quiet_rate)
    parser.add_argument("--noise-factor", type=float, default=default.noise_factor)
    parser.add_argument("--seed", type=int, default=default.seed)
    args = parser.parse_args(argv)
    workload = TenantWorkload(
        duration_s=args.duration_s,
        quiet_rate=args.quiet_rate,
        noise_factor=args.noise_factor,
        seed=args.seed,
    )
    ratio = report(workload, Engine())
    print(f"quiet_p99_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
