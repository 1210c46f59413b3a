"""Whether this replica is alive: the answer `/v2/health/live` gives the kubelet.

A replica that answers HTTP but whose worker threads or event loop are stuck serves nothing;
liveness fails then, so the kubelet restarts the pod. `judge` decides from two measurements:

* a worker is wedged when its running unit of work has run longer than
  max(`health.stuck_batch_floor_s`, `health.stuck_batch_factor` x its expected time), or
  when its thread has died. The workers are the encoder executor, whose unit is the older of
  the batch being prepared (collated) and the one computing, and each generation engine's
  worker thread, whose unit is one step (schedule, forward, sample, deliver). The expected
  time is the worker's measured pace; before its first unit has finished there is no pace,
  and the floor alone applies.
* the event loop is stalled when it kept a callback waiting longer than
  `health.loop_stall_s`; `LoopHeartbeat` measures that from a thread. The probe itself is
  answered on the loop, so during a stall it gets no answer at all and the kubelet counts
  its timeout as a failure. A stall is remembered for as long again after it ends, so the
  probes just after it fail too and a loop that stalls again and again cannot pass by
  answering in the gaps.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fleetserve_runtime.core.config_sections import HealthConfig

__all__ = [
    "Liveness",
    "LoopHeartbeat",
    "RunningBatch",
    "Worker",
    "judge",
    "judge_worker",
    "judge_workers",
    "stuck_limit_s",
]

log = logging.getLogger("fleetserve.liveness")


@dataclass(frozen=True, slots=True)
class Liveness:
    """The liveness verdict and, when it fails, why."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RunningBatch:
    """A worker's unit of work running now (a batch, a step): when it started, its expected time."""

    started: float
    expected_s: float | None
    """The worker's measured pace applied to this unit; None before any was measured."""


@dataclass(frozen=True, slots=True)
class Worker:
    """A thread that must keep making progress, as it stands now."""

    name: str
    """Who it is in a reason: `executor`, `generation engine of version 'v1'`."""
    running: RunningBatch | None
    """Its unit of work running now; None while it is idle."""
    unit: str = "batch"
    """What its units are called in a reason."""
    alive: bool = True
    """False once its thread has ended while it should run: it will never make progress."""


def stuck_limit_s(expected_s: float | None, health: HealthConfig) -> float:
    """How long a unit of work expected to take `expected_s` may run before it counts as stuck."""
    if expected_s is None:
        return health.stuck_batch_floor_s
    return max(health.stuck_batch_floor_s, health.stuck_batch_factor * expected_s)


def judge(
    now: float, *, workers: Iterable[Worker], loop_lag_s: float, health: HealthConfig
) -> Liveness:
    """The verdict at `now`, given the workers and the loop's lag."""
    if loop_lag_s > health.loop_stall_s:
        return Liveness(
            ok=False,
            reason=f"event loop stalled for {loop_lag_s:.1f}s (limit {health.loop_stall_s:g}s)",
        )
    return judge_workers(now, workers=workers, health=health)


def judge_workers(now: float, *, workers: Iterable[Worker], health: HealthConfig) -> Liveness:
    """The workers' half of the verdict: the first dead or stuck one fails it."""
    for worker in workers:
        verdict = judge_worker(now, worker, health=health)
        if not verdict.ok:
            return verdict
    return Liveness(ok=True)


def judge_worker(now: float, worker: Worker, *, health: HealthConfig) -> Liveness:
    """One worker: is its thread gone, or its running unit past its stuck limit?"""
    if not worker.alive:
        return Liveness(ok=False, reason=f"{worker.name} dead: its worker thread ended")
    running = worker.running
    if running is None:
        return Liveness(ok=True)
    running_s = now - running.started
    limit = stuck_limit_s(running.expected_s, health)
    if running_s <= limit:
        return Liveness(ok=True)
    expected = "unmeasured" if running.expected_s is None else f"{running.expected_s * 1000:.3g}ms"
    return Liveness(
        ok=False,
        reason=(
            f"{worker.name} stuck: {worker.unit} running for {running_s:.1f}s, over its limit "
            f"of {limit:.1f}s (expected {expected})"
        ),
    )


class LoopHeartbeat:
    """Times, from a thread, how long the event loop keeps a callback waiting.

    The thread posts one callback at a time, a quarter of the stall limit apart (at most a
    second); `lag_s` is how long the posted one has waited so far, or the last wait over the
    limit while it is still remembered (see the module docstring).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        stall_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._loop = loop
        self._stall_s = stall_s
        self._interval_s = min(1.0, stall_s / 4)
        self._clock = clock
        self._lock = threading.Lock()
        self._posted_at: float | None = None
        self._last_stall: tuple[float, float] | None = None
        """(seconds, ended at) of the latest wait over the limit."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleetserve-heartbeat", daemon=True)

    def start(self) -> None:
        """Start posting heartbeats."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (and wait for it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def lag_s(self, now: float) -> float:
        """Seconds the loop has kept the pending heartbeat waiting, or a remembered stall."""
        with self._lock:
            pending = 0.0 if self._posted_at is None else now - self._posted_at
            last = self._last_stall
        if last is not None and now - last[1] <= last[0]:
            return max(pending, last[0])
        return pending

    def _run(self) -> None:
        warned = False
        while not self._stop.wait(self._interval_s):
            now = self._clock()
            with self._lock:
                posted = self._posted_at
                if posted is None:
                    self._posted_at = now
            if posted is None:
                warned = False
                try:
                    self._loop.call_soon_threadsafe(self._beat, now)
                except RuntimeError:
                    return  # the loop is closed: nothing left to watch
            elif not warned and now - posted > self._stall_s:
                # Logged from this thread: the stalled loop cannot log it itself.
                log.warning("event loop stalled", extra={"stalled_s": round(now - posted, 1)})
                warned = True

    def _beat(self, posted: float) -> None:
        now = self._clock()
        waited = now - posted
        with self._lock:
            self._posted_at = None
            if waited > self._stall_s:
                self._last_stall = (waited, now)
