"""``make bench-runtime``: dynamic batching measured side by side in one run.

Starts ``fleetserve-runtime`` with the MiniLM model on 127.0.0.1, once per configuration and
each time in a fresh process pinned to the server core, and drives it with the same seeded
closed-loop workload from the client core:

(a) dynamic batching with length buckets and packing, max batch 32;
(b) the same server with max batch 1 (the unbatched baseline);
(c) batching in arrival order, no buckets, no packing, each batch padded to its longest member.

Usage: ``.venv/bin/python -m bench.runtime_bench [--requests N] [--concurrency N] ...``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from bench.gemm import measure_peak_flops
from bench.loadgen import run_closed_loop
from bench.pinning import pin_current_process
from bench.report import ConfigResult, Measurement, RunClock, print_report, summarise
from bench.server_metrics import scrape
from bench.server_proc import (
    add_closed_loop_options,
    process_cpu_seconds,
    running_server,
    runtime_serve_argv,
)
from bench.textgen import PROFILES, generate_workload
from fleetserve_runtime.models.minilm import FLOPS_PER_TOKEN
from fleetserve_runtime.testing.process import free_port

MODEL_NAME = "minilm"


@dataclass(frozen=True)
class ServerConfig:
    """One server configuration under test.

    Attributes:
        label: Short name ("a", "b", "c").
        description: What the configuration does.
        args: Options that set it apart; the common ones come from ``server_argv``.
    """

    label: str
    description: str
    args: tuple[str, ...]


BATCHED = ("--buckets", "auto", "--max-batch-size", "32")
"""The runtime's own batching as a user runs it: length buckets, max batch 32."""
TORCH = ("--backend", "torch")
"""This bench measures the batcher's design, packing included, which only the torch encoder
does; MFU is also relative to torch's own GEMM peak. ONNX Runtime, the CPU default for
MiniLM in fp32, has its rows in the precision bench."""

CONFIGS = (
    ServerConfig("a", "buckets+packing, max 32", (*BATCHED, *TORCH)),
    ServerConfig("b", "no batching, max 1", ("--buckets", "auto", "--max-batch-size", "1", *TORCH)),
    ServerConfig(
        "c",
        "arrival order, padded, max 32",
        ("--buckets", "none", "--no-packing", "--max-batch-size", "32", *TORCH),
    ),
)


def request_body(text: str) -> bytes:
    """Return the Open Inference Protocol request for one text, serialised."""
    payload = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
    return json.dumps(payload).encode("utf-8")


def server_argv(runtime: Sequence[str], *, port: int, args: argparse.Namespace) -> list[str]:
    """Return the server command line shared by every configuration."""
    return [
        *runtime_serve_argv(runtime, model=args.model, name=MODEL_NAME, port=port),
        f"--max-queue-delay-ms={args.max_queue_delay_ms}",
        "--max-queue-size=4096",
        "--default-timeout-ms=30000",
        "--max-timeout-ms=30000",
    ]


@dataclass(frozen=True)
class RequestSet:
    """Pre-serialised request bodies: an unmeasured warm-up set and the measured set.

    Attributes:
        warmup: Bodies sent before the measured window.
        measured: Bodies sent in the measured window.
        measured_tokens: Total token count of the measured texts.
    """

    warmup: tuple[bytes, ...]
    measured: tuple[bytes, ...]
    measured_tokens: int


def build_requests(args: argparse.Namespace) -> RequestSet:
    """Generate the seeded texts once; every configuration gets the very same bytes."""
    workload = generate_workload(
        PROFILES[args.profile], args.warmup + args.requests, seed=args.seed
    )
    bodies = tuple(request_body(t) for t in workload.texts)
    return RequestSet(
        warmup=bodies[: args.warmup],
        measured=bodies[args.warmup :],
        measured_tokens=sum(workload.token_counts[args.warmup :]),
    )


def measure_config(
    config: ServerConfig,
    requests: RequestSet,
    *,
    args: argparse.Namespace,
    log_dir: Path,
) -> Measurement:
    """Start a fresh server for ``config``, warm it up, and measure one closed-loop run."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    url = f"{base_url}/v2/models/{MODEL_NAME}/infer"
    argv = [*server_argv(shlex.split(args.runtime), port=port, args=args), *config.args]
    with running_server(
        argv,
        base_url=base_url,
        core=args.server_core,
        log_path=log_dir / f"server-{config.label}.log",
    ) as pid:
        asyncio.run(run_closed_loop(url, requests.warmup, concurrency=args.concurrency))
        return _measure_window(url, base_url=base_url, pid=pid, requests=requests, args=args)


def _measure_window(
    url: str,
    *,
    base_url: str,
    pid: int,
    requests: RequestSet,
    args: argparse.Namespace,
) -> Measurement:
    """Run the measured closed loop, reading server counters and CPU times around it."""
    counters_before = scrape(base_url)
    server_cpu_before = process_cpu_seconds(pid)
    client_cpu_before = time.process_time()
    load = asyncio.run(
        run_closed_loop(
            url, requests.measured, concurrency=args.concurrency, time_limit_s=args.time_limit_s
        )
    )
    client_cpu_s = time.process_time() - client_cpu_before
    server_cpu_s = process_cpu_seconds(pid) - server_cpu_before
    return Measurement(
        load=load,
        counters=scrape(base_url) - counters_before,
        expected_real_tokens=requests.measured_tokens,
        server_cpu_s=server_cpu_s,
        client_cpu_s=client_cpu_s,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_closed_loop_options(parser)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="mixed")
    return parser.parse_args(argv)


def prepare_client(args: argparse.Namespace) -> tuple[RequestSet, float]:
    """Pin this process to the client's core, build the requests, measure the GEMM peak.

    The peak is measured on the server's core before any server starts, so nothing else runs
    there; it is returned with the requests.
    """
    pin_current_process(args.client_core)
    requests = build_requests(args)
    return requests, measure_peak_flops(core=args.server_core)


def measure_summary(
    config: ServerConfig,
    requests: RequestSet,
    *,
    args: argparse.Namespace,
    log_dir: Path,
    peak_flops: float,
) -> ConfigResult:
    """Measure ``config`` in a fresh server (``measure_config``) and summarise its figures."""
    measurement = measure_config(config, requests, args=args, log_dir=log_dir)
    return summarise(
        measurement,
        label=config.label,
        description=config.description,
        server_args=config.args,
        flops_per_token=FLOPS_PER_TOKEN,
        peak_flops=peak_flops,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run every configuration and print the report."""
    args = parse_args(argv)
    clock = RunClock()
    requests, peak_flops = prepare_client(args)
    results: list[ConfigResult] = []
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-") as log_dir:
        for config in CONFIGS:
            results.append(
                measure_summary(
                    config, requests, args=args, log_dir=Path(log_dir), peak_flops=peak_flops
                )
            )
    context = clock.context(
        args, peak_gemm_flops=peak_flops, flops_per_token=FLOPS_PER_TOKEN, torch=version("torch")
    )
    print_report(results, headline="a", baseline="b", context=context)


if __name__ == "__main__":
    main()
