"""How fast the queue and batcher form batches, with no model cost (target: ≥ 20,000 req/s).

Two figures, measured in one run:

* `policy`: requests pushed into `RequestQueue` and taken out by `plan_batch`, the pure
  scheduling work per request;
* `runtime`: requests through `Runtime.infer` (preprocess, queue, scheduler task, executor
  threads, futures) with the synthetic model at zero latency, no HTTP.

The last line is the headline, `scheduler_requests_per_s=<policy figure>`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Sequence

from fleetserve_runtime.encoder.batcher import BatchLimits, LearnedBuckets, plan_batch
from fleetserve_runtime.encoder.request_queue import RequestQueue
from fleetserve_runtime.serving.runtime import InferenceCall, Runtime
from fleetserve_runtime.testing import make_config, make_items

LIMITS = BatchLimits(
    max_batch_size=32,
    max_queue_delay_s=0.010,
    max_batch_tokens=0,
    aging_s=0.2,
    lower_class_share=0.1,
    min_padding_efficiency=0.85,
)


def policy_rate(requests: int, *, seed: int) -> tuple[float, float]:
    """Requests per second through push + plan_batch, and the mean batch size formed."""
    rng = random.Random(seed)
    buckets = LearnedBuckets(256)
    lengths = [rng.choice((rng.randint(5, 18), rng.randint(9, 55))) for _ in range(requests)]
    for length in lengths:
        buckets.observe(length)
    queue = RequestQueue(max_size=requests, retry_after_s=1)
    now = 0.0
    batches = 0
    started = time.perf_counter()
    for start in range(0, requests, 64):
        chunk = lengths[start : start + 64]
        queue.push(make_items(chunk, now=now, bucket_of=buckets.bucket_of))
        now += 0.001
        while len(queue) >= LIMITS.max_batch_size:
            plan = plan_batch(queue, now, LIMITS)
            batches += plan.batch is not None
    while len(queue):
        batches += plan_batch(queue, now + 1.0, LIMITS).batch is not None
    elapsed = time.perf_counter() - started
    return requests / elapsed, requests / batches


async def runtime_rate(requests: int, *, concurrency: int) -> float:
    """Requests per second through `Runtime.infer` with a zero-cost model."""
    config = make_config(
        model="builtin://synthetic?latency_ms=0&per_item_ms=0",
        batching={"max_batch_size": 32, "max_queue_delay_ms": 1},
        queue={"max_queue_size": 8192},
    )
    runtime = Runtime(config)
    await runtime.start()
    await runtime.wait_ready()
    per_worker = requests // concurrency

    async def worker() -> None:
        for i in range(per_worker):
            await runtime.infer(InferenceCall(instances=[f"word {i % 50}"]))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await runtime.stop()
    return per_worker * concurrency / elapsed


def main(argv: Sequence[str] | None = None) -> None:
    """Run both measurements and print them, headline last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--runtime-requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args(argv)
    policy, mean_batch = policy_rate(args.requests, seed=0)
    through_runtime = asyncio.run(runtime_rate(args.runtime_requests, concurrency=args.concurrency))
    print(f"policy: {policy:,.0f} requests/s batched (mean batch {mean_batch:.1f})")
    print(f"runtime (no HTTP, zero-cost model): {through_runtime:,.0f} requests/s")
    print(f"runtime_requests_per_s={through_runtime:.0f}")
    print(f"scheduler_requests_per_s={policy:.0f}")


if __name__ == "__main__":
    main()
