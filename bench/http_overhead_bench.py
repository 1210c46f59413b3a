"""The cost of a request outside the model: the runtime at zero model cost vs bare FastAPI.

Two servers, measured one after the other in one run with the same pinning (server on
``--server-core``, this load generator on ``--client-core``), the same closed-loop clients
and the same bytes (one short text per request unless ``--instances`` says more):

* ``bare``: ``bench.bare_fastapi``, FastAPI + uvicorn (uvloop, httptools) parsing the body
  into the same pydantic schema and answering a constant;
* ``runtime``: ``fleetserve-runtime serve`` with the synthetic model at zero latency, so
  everything it measures is HTTP, validation, queueing, batching, hand-offs, metrics and logs.

Targets: ``http_overhead_ratio`` (runtime / bare req/s) ≥ 0.8, and the runtime's p99 within
``max_queue_delay_ms`` + 2 × the bare p99. ``--py-spy DIR`` records each server's measured
window as folded stacks, ``DIR/<label>.folded`` (open in speedscope or flamegraph.pl); py-spy
must be able to attach (same user, ptrace allowed).

``--instances N`` sends N texts per request (the front end's ceiling in texts/s);
``--compare LABEL=COMMAND`` measures another runtime build in the same run (before/after).

Last line: ``http_overhead_ratio=<runtime req/s / bare req/s>``.

Usage: ``.venv/bin/python -m bench.http_overhead_bench [--requests N] [--concurrency N] ...``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.loadgen import LoadResult, run_closed_loop
from bench.pinning import pin_current_process
from bench.server_proc import process_cpu_seconds, running_server, runtime_serve_argv
from fleetserve_runtime.testing.process import free_port

MODEL_NAME = "overhead"
ZERO_COST_MODEL = "builtin://synthetic?latency_ms=0&per_item_ms=0"
TEXT = "a short query about the weather"


@dataclass(frozen=True)
class ServerRun:
    """One server's measured window.

    Attributes:
        label: ``bare`` or ``runtime``.
        load: What the closed loop measured.
        server_cpu_s: CPU seconds the server used during the window.
    """

    label: str
    load: LoadResult
    server_cpu_s: float

    @property
    def errors(self) -> int:
        """Requests that got no 2xx answer."""
        return sum(n for code, n in self.load.status_counts.items() if not 200 <= code < 300)

    def row(self) -> str:
        """One table row: req/s, p50, p99, server CPU per request, errors."""
        load = self.load
        cpu_us = 1e6 * self.server_cpu_s / max(load.succeeded, 1)
        return (
            f"{self.label:<8} {load.throughput_rps:>9.0f} {load.latency_ms(0.5):>8.2f} "
            f"{load.latency_ms(0.99):>8.2f} {cpu_us:>10.0f} {self.errors:>6}"
        )


def request_body(instances: int = 1) -> bytes:
    """The one Open Inference Protocol request every client sends: `instances` short texts."""
    data = [f"{TEXT} {n}" for n in range(instances)]
    payload = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [instances], "data": data}]
    }
    return json.dumps(payload).encode()


def bare_argv(port: int) -> list[str]:
    """The bare FastAPI server's command line."""
    return [sys.executable, "-m", "bench.bare_fastapi", f"--port={port}"]


def runtime_argv(runtime: Sequence[str], port: int, args: argparse.Namespace) -> list[str]:
    """The runtime's command line: the zero-cost synthetic model, batches of up to 32."""
    return [
        *runtime_serve_argv(runtime, model=ZERO_COST_MODEL, name=MODEL_NAME, port=port),
        f"--max-queue-delay-ms={args.max_queue_delay_ms}",
        "--max-batch-size=32",
        "--max-queue-size=4096",
        "--default-timeout-ms=30000",
        "--max-timeout-ms=30000",
    ]


@contextlib.contextmanager
def _py_spy_record(pid: int, out: Path | None) -> Iterator[None]:
    """Record `pid`'s stacks with py-spy while the block runs, when `out` is set."""
    if out is None:
        yield
        return
    beside = Path(sys.executable).with_name("py-spy")
    py_spy = str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"
    recorder = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--output",
            str(out),
            "--format",
            "raw",
            "--rate",
            "250",
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        # py-spy writes its output on SIGINT.
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=60)


def measure(
    label: str, make_argv: Callable[[int], list[str]], args: argparse.Namespace, log_dir: Path
) -> ServerRun:
    """Start one server (`make_argv(port)`) pinned to the server core, warm up, measure."""
    port = free_port()
    argv = make_argv(port)
    base_url = f"http://127.0.0.1:{port}"
    url = f"{base_url}/v2/models/{MODEL_NAME}/infer"
    bodies = (request_body(args.instances),)
    with running_server(
        argv, base_url=base_url, core=args.server_core, log_path=log_dir / f"{label}.log"
    ) as pid:
        asyncio.run(
            run_closed_loop(url, bodies, concurrency=args.concurrency, requests=args.warmup)
        )
        stacks = Path(args.py_spy) / f"{label}.folded" if args.py_spy else None
        cpu_before = process_cpu_seconds(pid)
        with _py_spy_record(pid, stacks):
            load = asyncio.run(
                run_closed_loop(
                    url,
                    bodies,
                    concurrency=args.concurrency,
                    requests=args.requests,
                    time_limit_s=args.time_limit_s,
                )
            )
        return ServerRun(label, load, process_cpu_seconds(pid) - cpu_before)


def _runtime_factory(command: str, args: argparse.Namespace) -> Callable[[int], list[str]]:
    words = shlex.split(command)
    return lambda port: runtime_argv(words, port, args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    default_runtime = str(Path(sys.executable).with_name("fleetserve-runtime"))
    parser.add_argument("--runtime", default=default_runtime, help="server command (shell words)")
    parser.add_argument("--requests", type=int, default=20_000, help="measured requests each")
    parser.add_argument("--warmup", type=int, default=1_000, help="unmeasured requests each")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    parser.add_argument(
        "--instances", type=int, default=1, help="texts per request (front-end ceiling runs)"
    )
    parser.add_argument("--max-queue-delay-ms", type=float, default=10.0)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--time-limit-s", type=float, default=120.0, help="per measured run")
    parser.add_argument("--py-spy", metavar="DIR", help="write folded stacks per server here")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="LABEL=COMMAND",
        help="also measure another runtime build (e.g. before a change), same flags; repeatable",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Measure both servers and print the table, the targets and the ratio."""
    args = parse_args(argv)
    pin_current_process(args.client_core)
    if args.py_spy:
        Path(args.py_spy).mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fleetserve-overhead-") as tmp:
        log_dir = Path(tmp)
        bare = measure("bare", bare_argv, args, log_dir)
        others = [
            measure(label, _runtime_factory(command, args), args, log_dir)
            for label, _, command in (entry.partition("=") for entry in args.compare)
        ]
        ours = measure("runtime", _runtime_factory(args.runtime, args), args, log_dir)
    print(f"{'server':<8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'cpu us/req':>10} errors")
    for run in (bare, *others, ours):
        print(run.row())
    ratio = ours.load.throughput_rps / max(bare.load.throughput_rps, 1e-9)
    bound = args.max_queue_delay_ms + 2 * bare.load.latency_ms(0.99)
    p99 = ours.load.latency_ms(0.99)
    print(f"p99_bound_ms={bound:.2f} (max queue delay + 2 x bare p99); runtime p99={p99:.2f}")
    print(f"runtime_texts_per_s={ours.load.throughput_rps * args.instances:.0f}")
    print(f"loadavg_1m_start={load_before:.2f} loadavg_1m_end={os.getloadavg()[0]:.2f}")
    print(f"p99_within_bound={p99 <= bound}")
    print(f"http_overhead_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
