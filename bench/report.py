"""Turn one configuration's measurements into figures, and print the benchmark's report.

``bench.runtime_bench`` builds a ``ConfigResult`` per server configuration and calls
``print_report`` once. The report is a rich table, the JSON of everything, and last the three
``key=value`` lines, so scripts can read them with ``tail -3``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.loadgen import LoadResult
from bench.server_metrics import ServerCounters


def _load_1m() -> float:
    return os.getloadavg()[0]


@dataclass(frozen=True)
class RunClock:
    """When a benchmark run began and the machine's load then; `context` describes the run."""

    started: float = field(default_factory=time.perf_counter)
    load_before: float = field(default_factory=_load_1m)

    def context(
        self, args: argparse.Namespace, *, omit: Collection[str] = (), **extra: Any
    ) -> dict[str, Any]:
        """The report's context: the options (less `omit`), the run's facts, then `extra`.

        Other work on the machine skews every figure; a load average far above the busy cores
        of a benchmark says the run was not alone.
        """
        return {
            **{k: v for k, v in vars(args).items() if k not in omit},
            "wall_s": round(time.perf_counter() - self.started, 1),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_1m_start": self.load_before,
            "loadavg_1m_end": _load_1m(),
            **extra,
        }


@dataclass(frozen=True)
class ConfigResult:
    """What one server configuration achieved in the measured window.

    Attributes:
        label: Short name used in the table and the final lines ("a", "b", "c").
        description: What the configuration does.
        server_args: The configuration's own server options.
        sent: Requests sent in the measured window.
        succeeded: Requests answered 2xx.
        client_status_counts: Requests per HTTP status as the client saw them (0 = no answer).
        timed_out: True when the global time limit cut the run short.
        elapsed_s: Measured wall time in seconds.
        throughput_rps: Successful requests per second.
        p50_ms: Median latency of successful requests, in milliseconds.
        p90_ms: 90th-percentile latency, in milliseconds.
        p99_ms: 99th-percentile latency, in milliseconds.
        mean_batch_size: Requests per batch, from the server's histogram.
        padding_efficiency: Real over computed tokens, from the server's counters.
        real_tokens: Real tokens the server computed in the window.
        expected_real_tokens: Real tokens of the requests sent, by the bench's own tokenizer.
        real_tokens_per_s: Real tokens per second.
        mfu: Useful model FLOP/s (real tokens only) over the measured peak GEMM FLOP/s.
        server_cpu_util: Server CPU-seconds per wall second; well under 1 at saturation means
            the server waited, or shared its core with something else.
        server_cpu_ms_per_request: Server CPU milliseconds per successful request.
        client_cpu_util: Load generator CPU-seconds per wall second; near 1 would mean the
            client, not the server, limited the throughput.
    """

    label: str
    description: str
    server_args: tuple[str, ...]
    sent: int
    succeeded: int
    client_status_counts: Mapping[int, int]
    timed_out: bool
    elapsed_s: float
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_batch_size: float
    padding_efficiency: float
    real_tokens: float
    expected_real_tokens: int
    real_tokens_per_s: float
    mfu: float
    server_cpu_util: float
    server_cpu_ms_per_request: float
    client_cpu_util: float


@dataclass(frozen=True)
class Measurement:
    """Raw inputs of one configuration's figures (see ``summarise``).

    Attributes:
        load: The client's view of the measured window.
        counters: Change of the server's counters over the same window.
        expected_real_tokens: Token count of the measured requests, by the bench's tokenizer.
        server_cpu_s: CPU time the server process used in the window, in seconds.
        client_cpu_s: CPU time the load generator used in the window, in seconds.
    """

    load: LoadResult
    counters: ServerCounters
    expected_real_tokens: int
    server_cpu_s: float
    client_cpu_s: float


def summarise(
    measurement: Measurement,
    *,
    label: str,
    description: str,
    server_args: Sequence[str],
    flops_per_token: float,
    peak_flops: float,
) -> ConfigResult:
    """Compute one configuration's figures.

    Args:
        measurement: Client and server measurements of the window.
        label: Short configuration name.
        description: What the configuration does.
        server_args: The configuration's own server options.
        flops_per_token: Model FLOPs per real token.
        peak_flops: Peak GEMM FLOP/s of the server's core.

    Returns:
        The figures.
    """
    load, counters = measurement.load, measurement.counters
    per_s = 1.0 / load.elapsed_s if load.elapsed_s > 0 else 0.0
    tokens_per_s = counters.real_tokens * per_s
    return ConfigResult(
        label=label,
        description=description,
        server_args=tuple(server_args),
        sent=sum(load.status_counts.values()),
        succeeded=load.succeeded,
        client_status_counts=dict(load.status_counts),
        timed_out=load.timed_out,
        elapsed_s=load.elapsed_s,
        throughput_rps=load.throughput_rps,
        p50_ms=load.latency_ms(0.50),
        p90_ms=load.latency_ms(0.90),
        p99_ms=load.latency_ms(0.99),
        mean_batch_size=counters.mean_batch_size,
        padding_efficiency=counters.padding_efficiency,
        real_tokens=counters.real_tokens,
        expected_real_tokens=measurement.expected_real_tokens,
        real_tokens_per_s=tokens_per_s,
        mfu=tokens_per_s * flops_per_token / peak_flops,
        server_cpu_util=measurement.server_cpu_s * per_s,
        server_cpu_ms_per_request=1000.0 * measurement.server_cpu_s / max(load.succeeded, 1),
        client_cpu_util=measurement.client_cpu_s * per_s,
    )


def _table(results: Sequence[ConfigResult]) -> Table:
    """Return the side-by-side table of the configurations."""
    table = Table(title="fleetserve-runtime, closed loop")
    for column in (
        "config",
        "req/s",
        "p50 ms",
        "p99 ms",
        "mean batch",
        "pad eff",
        "mfu",
        "srv cpu",
        "ok/sent",
    ):
        table.add_column(column, justify="left" if column == "config" else "right")
    for r in results:
        table.add_row(
            f"({r.label}) {r.description}",
            f"{r.throughput_rps:.1f}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.mean_batch_size:.2f}",
            f"{r.padding_efficiency:.3f}",
            f"{r.mfu:.3f}",
            f"{r.server_cpu_util:.2f}",
            f"{r.succeeded}/{r.sent}",
        )
    return table


def print_report(
    results: Sequence[ConfigResult],
    *,
    headline: str,
    baseline: str,
    context: Mapping[str, Any],
) -> None:
    """Print the table, the JSON of all results, and the three closing lines.

    Args:
        results: Every configuration's figures, in run order.
        headline: Label of the configuration the closing lines describe ("a").
        baseline: Label of the unbatched configuration the speedup divides by ("b").
        context: Run parameters and environment, included in the JSON.
    """
    by_label = {r.label: r for r in results}
    head, base = by_label[headline], by_label[baseline]
    speedup = head.throughput_rps / base.throughput_rps if base.throughput_rps else 0.0
    Console(width=120).print(_table(results))
    document = {"context": dict(context), "results": [asdict(r) for r in results]}
    print(json.dumps(document, indent=2, default=str))
    print(f"padding_efficiency={head.padding_efficiency:.3f}")
    print(f"mfu={head.mfu:.3f}")
    print(f"batching_speedup={speedup:.2f}")
