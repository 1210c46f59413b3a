"""Closed-loop HTTP load generator (asyncio + aiohttp).

``bench.runtime_bench`` drives the runtime with it; e2e tests may reuse ``run_closed_loop``.
N workers each send their next request as soon as the previous one completes (protocol §7.2,
load shape 1). Bodies are serialised before the clock starts, so the client spends its CPU on
HTTP only; aiohttp is used because it costs less client CPU per request than httpx.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

#: Status code recorded for a request that got no HTTP response (connection error, timeout).
TRANSPORT_ERROR = 0


@dataclass(frozen=True)
class LoadResult:
    """What one closed-loop run measured, client side.

    Attributes:
        latencies_s: Latency of every request that got a 2xx answer, in completion order.
        status_counts: Requests per HTTP status; ``TRANSPORT_ERROR`` for no response.
        elapsed_s: Wall time from the first send to the last completion, in seconds.
        timed_out: True when the global time limit stopped the run early.
    """

    latencies_s: tuple[float, ...]
    status_counts: Mapping[int, int]
    elapsed_s: float
    timed_out: bool

    @property
    def succeeded(self) -> int:
        """Number of requests answered with a 2xx status."""
        return len(self.latencies_s)

    @property
    def throughput_rps(self) -> float:
        """Successful requests per second over the whole run."""
        return self.succeeded / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def latency_ms(self, quantile: float) -> float:
        """Return the nearest-rank latency quantile in milliseconds (NaN without successes).

        Args:
            quantile: Quantile in (0, 1], e.g. 0.99.
        """
        if not self.latencies_s:
            return math.nan
        ordered = sorted(self.latencies_s)
        rank = max(math.ceil(quantile * len(ordered)) - 1, 0)
        return ordered[rank] * 1000.0


@dataclass
class Tally:
    """Mutable per-run counters shared by a closed loop's clients (one event loop, so no lock).

    `next_index` is the next request to claim; each answered one adds its status, and its
    latency when it succeeded.
    """

    next_index: int = 0
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)

    def result(self, elapsed_s: float, timed_out: bool) -> LoadResult:
        """The run's `LoadResult`: these counts over `elapsed_s`."""
        return LoadResult(
            latencies_s=tuple(self.latencies_s),
            status_counts=dict(self.statuses),
            elapsed_s=elapsed_s,
            timed_out=timed_out,
        )


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    total: int,
    tally: Tally,
) -> None:
    """Send requests back to back until ``total`` have been claimed by all workers."""
    headers = {"Content-Type": "application/json"}
    while tally.next_index < total:
        body = bodies[tally.next_index % len(bodies)]
        tally.next_index += 1
        start = time.perf_counter()
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError):
            status = TRANSPORT_ERROR
        tally.statuses[status] += 1
        if 200 <= status < 300:
            tally.latencies_s.append(time.perf_counter() - start)


async def run_clients(
    client: Callable[[aiohttp.ClientSession], Awaitable[None]],
    *,
    concurrency: int,
    time_limit_s: float,
    request_timeout_s: float,
) -> tuple[float, bool]:
    """Run ``concurrency`` copies of ``client`` on one session; (elapsed seconds, timed out).

    One keep-alive connection per client, as the protocol's HTTP/1.1 keep-alive asks; every
    request is bounded by ``request_timeout_s`` and the whole run by ``time_limit_s``.
    """
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    timed_out = False
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        try:
            async with asyncio.timeout(time_limit_s):
                await asyncio.gather(*(client(session) for _ in range(concurrency)))
        except TimeoutError:
            timed_out = True
        return time.perf_counter() - start, timed_out


async def run_closed_loop(
    url: str,
    bodies: Sequence[bytes],
    *,
    concurrency: int,
    requests: int | None = None,
    time_limit_s: float = 600.0,
    request_timeout_s: float = 60.0,
) -> LoadResult:
    """Run a closed loop of ``concurrency`` clients against ``url``.

    Args:
        url: Endpoint to POST to.
        bodies: Pre-serialised request bodies, sent in order (cycled if ``requests`` is larger).
        concurrency: Number of clients, each with at most one request in flight.
        requests: Total requests to send; defaults to ``len(bodies)``.
        time_limit_s: Global limit; the run stops (and says so) when it is reached.
        request_timeout_s: Limit per request; a request over it counts as a transport error.

    Returns:
        Latencies, status counts and elapsed time.
    """
    total = len(bodies) if requests is None else requests
    tally = Tally()
    elapsed, timed_out = await run_clients(
        lambda session: _worker(session, url, bodies, total, tally),
        concurrency=concurrency,
        time_limit_s=time_limit_s,
        request_timeout_s=request_timeout_s,
    )
    return tally.result(elapsed, timed_out)
