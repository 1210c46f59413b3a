"""Whether this replica is alive: the answer `/v2/health/live` gives the kubelet.

A replica that answers HTTP but whose executor or event loop is stuck serves nothing;
liveness fails then, so the kubelet restarts the pod. `judge` decides from two measurements:

* the executor is wedged when its running batch has run longer than
  max(`health.stuck_batch_floor_s`, `health.stuck_batch_factor` x its expected time). The
  running batch is the older of the one being prepared (collated) and the one computing.
  The expected time is the executor's measured pace (per token for compute, per batch for
  prepare); before the first batch has finished there is no pace, and the floor alone
  applies.
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
from collections.abc import Callable
from dataclasses import dataclass

from fleetserve_runtime.config import HealthConfig

__all__ = [
    "Liveness",
    "LoopHeartbeat",
    "RunningBatch",
    "judge",
    "judge_executor",
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
    """A batch the executor is preparing or computing: when it started, how long it should take."""

    started: float
    expected_s: float | None
    """Measured pace per token x its tokens; None before any batch has been measured."""


def stuck_limit_s(expected_s: float | None, health: HealthConfig) -> float:
    """How long a batch expected to take `expected_s` may run before it counts as stuck."""
    if expected_s is None:
        return health.stuck_batch_floor_s
    return max(health.stuck_batch_floor_s, health.stuck_batch_factor * expected_s)


def judge(
    now: float, *, batch: RunningBatch | None, loop_lag_s: float, health: HealthConfig
) -> Liveness:
    """The verdict at `now`, given the running batch (None: idle) and the loop's lag."""
    if loop_lag_s > health.loop_stall_s:
        return Liveness(
            ok=False,
            reason=f"event loop stalled for {loop_lag_s:.1f}s (limit {health.loop_stall_s:g}s)",
        )
    return judge_executor(now, batch=batch, health=health)


def judge_executor(now: float, *, batch: RunningBatch | None, health: HealthConfig) -> Liveness:
    """The executor's half of the verdict: is the running batch past its stuck limit?"""
    if batch is None:
        return Liveness(ok=True)
    running_s = now - batch.started
    limit = stuck_limit_s(batch.expected_s, health)
    if running_s <= limit:
        return Liveness(ok=True)
    expected = "unmeasured" if batch.expected_s is None else f"{batch.expected_s * 1000:.3g}ms"
    return Liveness(
        ok=False,
        reason=(
            f"executor stuck: batch running for {running_s:.1f}s, over its limit of "
            f"{limit:.1f}s (expected {expected})"
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
