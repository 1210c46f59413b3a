"""``make bench-runtime``, wire section: JSON vs the binary tensor data extension.

One MiniLM server (pinned to the server core) answers the same closed-loop load twice, in
alternating rounds: every request embeds ``--batch`` texts, so each answer carries
``batch × 384`` floats, once as JSON numbers and once as raw little-endian FP32 after a JSON
header (``Inference-Header-Content-Length``). The client decodes each answer into a float32
array, as a real client must, so the figures include what each format costs both ends.

Prints requests/s and p50/p99 latency per format; the last line is
``binary_vs_json=<binary req/s ÷ JSON req/s>``.

Usage: ``.venv/bin/python -m bench.wire_bench [--requests N] [--batch N] ...``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import numpy.typing as npt
import orjson

from bench.loadgen import TRANSPORT_ERROR, LoadResult, Tally, run_clients
from bench.pinning import pin_current_process
from bench.server_proc import running_server, runtime_serve_argv
from bench.textgen import PROFILES, generate_workload
from fleetserve_runtime.testing.process import free_port

MODEL_NAME = "minilm"
FORMATS = ("json", "binary")


@dataclass(frozen=True)
class Request:
    """One pre-serialised request: its body and headers."""

    body: bytes
    headers: dict[str, str]


def json_request(texts: Sequence[str]) -> Request:
    """The OIP JSON request embedding `texts`, asking for a JSON answer."""
    tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
    body = orjson.dumps({"inputs": [tensor]})
    return Request(body, {"Content-Type": "application/json"})


def binary_request(texts: Sequence[str]) -> Request:
    """The same request in the binary extension (as tritonclient sends it by default)."""
    raw = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    tensor = {
        "name": "text",
        "datatype": "BYTES",
        "shape": [len(texts)],
        "parameters": {"binary_data_size": len(raw)},
    }
    header = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return Request(header + raw, headers)


def decode_answer(content: bytes, header_length: str | None) -> npt.NDArray[np.float32]:
    """The embeddings of an answer in either format."""
    if header_length is None:
        output = orjson.loads(content)["outputs"][0]
        return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    size = int(header_length)
    output = orjson.loads(content[:size])["outputs"][0]
    return np.frombuffer(content[size:], dtype="<f4").reshape(output["shape"])


@dataclass
class _Tally(Tally):
    """A closed loop's counters, and the answer bytes received."""

    response_bytes: int = 0


async def _drive(
    url: str, requests: Sequence[Request], total: int, *, concurrency: int, time_limit_s: float
) -> tuple[LoadResult, int]:
    """A closed loop of `concurrency` clients; the result and the answer bytes received."""
    tally = _Tally()

    async def client(session: aiohttp.ClientSession) -> None:
        while tally.next_index < total:
            request = requests[tally.next_index % len(requests)]
            tally.next_index += 1
            start = time.perf_counter()
            try:
                async with session.post(url, data=request.body, headers=request.headers) as answer:
                    content = await answer.read()
                    status = answer.status
                    header_length = answer.headers.get("Inference-Header-Content-Length")
                if status == 200:
                    decode_answer(content, header_length)
                    tally.response_bytes += len(content)
            except (aiohttp.ClientError, TimeoutError):
                status = TRANSPORT_ERROR
            tally.statuses[status] += 1
            if status == 200:
                tally.latencies_s.append(time.perf_counter() - start)

    elapsed, timed_out = await run_clients(
        client, concurrency=concurrency, time_limit_s=time_limit_s, request_timeout_s=60.0
    )
    return tally.result(elapsed, timed_out), tally.response_bytes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; defaults are the measured configuration."""
    parser = argparse.ArgumentParser(prog="bench.wire_bench", description=__doc__)
    parser.add_argument("--model", default="builtin://minilm-l6")
    parser.add_argument("--requests", type=int, default=200, help="per format and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per format")
    parser.add_argument("--batch", type=int, default=32, help="texts per request")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=20, help="requests per format, unmeasured")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--time-limit-s", type=float, default=300.0, help="per measured run")
    return parser.parse_args(argv)


@dataclass
class _Totals:
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    response_bytes: int = 0
    timed_out: bool = False

    def add(self, result: LoadResult, response_bytes: int) -> None:
        self.latencies_s += result.latencies_s
        self.statuses.update(result.status_counts)
        self.elapsed_s += result.elapsed_s
        self.response_bytes += response_bytes
        self.timed_out |= result.timed_out

    def result(self) -> LoadResult:
        return LoadResult(
            tuple(self.latencies_s), dict(self.statuses), self.elapsed_s, self.timed_out
        )


async def _measure(url: str, args: argparse.Namespace) -> dict[str, _Totals]:
    """Warm both formats up, then alternate measured rounds so drift hits both alike."""
    texts = generate_workload(PROFILES["mixed"], args.batch * 8, seed=args.seed).texts
    groups = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    requests = {
        "json": [json_request(group) for group in groups],
        "binary": [binary_request(group) for group in groups],
    }
    totals = {name: _Totals() for name in FORMATS}
    for name in FORMATS:
        await _drive(
            url,
            requests[name],
            args.warmup,
            concurrency=args.concurrency,
            time_limit_s=args.time_limit_s,
        )
    for _ in range(args.rounds):
        for name in FORMATS:
            result, received = await _drive(
                url,
                requests[name],
                args.requests,
                concurrency=args.concurrency,
                time_limit_s=args.time_limit_s,
            )
            totals[name].add(result, received)
    return totals


def main(argv: Sequence[str] | None = None) -> None:
    """Measure both formats on one server and print the comparison."""
    args = parse_args(argv)
    pin_current_process(args.client_core)
    port = free_port()
    argv_server = [
        *runtime_serve_argv([str(Path(sys.executable).with_name("fleetserve-runtime"))],
                            model=args.model, name=MODEL_NAME, port=port),
        f"--max-batch-size={args.batch}",
        f"--max-instances={args.batch}",
        "--max-body-bytes=16777216",
    ]  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fleetserve-wire-") as log_dir:
        log_path = Path(log_dir) / "server.log"
        with running_server(
            argv_server, base_url=base_url, core=args.server_core, log_path=log_path
        ):
            totals = asyncio.run(_measure(f"{base_url}/v2/models/{MODEL_NAME}/infer", args))
    print(f"wire formats: {args.model}, {args.batch} texts per request, concurrency "
          f"{args.concurrency}, {args.rounds}×{args.requests} requests per format; "
          f"loadavg {load_before:.2f} → {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'format':<8} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'KiB/answer':>11}  statuses")
    results = {name: totals[name].result() for name in FORMATS}
    for name in FORMATS:
        result = results[name]
        per_answer = totals[name].response_bytes / max(result.succeeded, 1) / 1024
        print(
            f"{name:<8} {result.throughput_rps:>9.1f} {result.latency_ms(0.5):>9.1f} "
            f"{result.latency_ms(0.99):>9.1f} {per_answer:>11.1f}  {dict(result.status_counts)}"
        )
    json_rps = results["json"].throughput_rps
    p99_ratio = results["binary"].latency_ms(0.99) / results["json"].latency_ms(0.99)
    print(f"p99_binary_vs_json={p99_ratio:.3f}")
    ratio = results["binary"].throughput_rps / json_rps if json_rps else float("nan")
    print(f"binary_vs_json={ratio:.3f}")


if __name__ == "__main__":
    main()
