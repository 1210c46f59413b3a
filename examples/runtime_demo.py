"""`make demo`: the runtime with the real MiniLM encoder, a concurrent burst, its batches.

Starts `fleetserve-runtime serve --model builtin://minilm-l6` on a free loopback port (pinned
to one core), checks that paraphrases score closer than unrelated sentences, sends requests
one at a time and then as a concurrent burst of mixed-length texts, and shows how the server
grouped them: batch sizes, padding efficiency, per-stage latency, and the speed-up. With
`--hold` the server keeps running until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from bench.server_metrics import scrape
from bench.server_proc import running_server
from bench.textgen import PROFILES, generate_workload
from fleetserve_runtime.testing.process import free_port

console = Console()
MODEL = "minilm"
PARAPHRASES = (
    "How do I reset my password?",
    "What are the steps to change my password?",
    "The weather in Lisbon is sunny today.",
)


@dataclass(frozen=True)
class Answer:
    """One request as the client saw it."""

    tokens: int
    batch_size: int
    queue_ms: float
    compute_ms: float
    latency_ms: float
    status: int


def body(texts: list[str]) -> dict[str, object]:
    """An Open Inference Protocol request for `texts`."""
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}


def timing(header: str, stage: str) -> float:
    """Milliseconds of `stage` in a Server-Timing header."""
    for part in header.split(","):
        name, _, rest = part.strip().partition(";dur=")
        if name == stage:
            return float(rest)
    return 0.0


async def send(client: httpx.AsyncClient, text: str, tokens: int) -> Answer:
    """Send one text; record what the server said about its batch."""
    started = time.perf_counter()
    response = await client.post(f"/v2/models/{MODEL}/infer", json=body([text]))
    server_timing = response.headers.get("server-timing", "")
    return Answer(
        tokens=tokens,
        batch_size=int(response.headers.get("x-fleetserve-batch-size", "0")),
        queue_ms=timing(server_timing, "queue"),
        compute_ms=timing(server_timing, "compute"),
        latency_ms=(time.perf_counter() - started) * 1000,
        status=response.status_code,
    )


async def similarity(client: httpx.AsyncClient) -> None:
    """Show cosine similarities: the paraphrase pair must beat the unrelated sentence."""
    response = await client.post(f"/v2/models/{MODEL}/infer", json=body(list(PARAPHRASES)))
    output = response.json()["outputs"][0]
    vectors = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    table = Table(title="Cosine similarity (all-MiniLM-L6-v2, served)")
    table.add_column("sentence A")
    table.add_column("sentence B")
    table.add_column("cosine", justify="right")
    for a, b in ((0, 1), (0, 2), (1, 2)):
        table.add_row(PARAPHRASES[a], PARAPHRASES[b], f"{float(vectors[a] @ vectors[b]):.3f}")
    console.print(table)


async def burst(client: httpx.AsyncClient, texts: list[str], tokens: list[int]) -> float:
    """Send all texts at once; print the batches they formed; return requests per second."""
    started = time.perf_counter()
    answers = await asyncio.gather(
        *(send(client, t, n) for t, n in zip(texts, tokens, strict=True))
    )
    elapsed = time.perf_counter() - started
    sizes = Counter(a.batch_size for a in answers)
    table = Table(title=f"Burst of {len(answers)} concurrent requests: how they were batched")
    for column in ("batch size", "requests", "mean tokens", "queue ms p50", "compute ms p50"):
        table.add_column(column, justify="right")
    for size in sorted(sizes):
        group = [a for a in answers if a.batch_size == size]
        table.add_row(
            str(size),
            str(len(group)),
            f"{statistics.mean(a.tokens for a in group):.1f}",
            f"{statistics.median(a.queue_ms for a in group):.1f}",
            f"{statistics.median(a.compute_ms for a in group):.1f}",
        )
    console.print(table)
    latencies = sorted(a.latency_ms for a in answers)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    codes = Counter(a.status for a in answers)
    console.print(
        f"statuses {dict(codes)} · latency p50 {statistics.median(latencies):.0f} ms, "
        f"p99 {p99:.0f} ms · {len(answers) / elapsed:.1f} requests/s"
    )
    return len(answers) / elapsed


async def one_at_a_time(client: httpx.AsyncClient, texts: list[str], tokens: list[int]) -> float:
    """Send texts sequentially (batch of one each); return requests per second."""
    started = time.perf_counter()
    for text, count in zip(texts, tokens, strict=True):
        await send(client, text, count)
    return len(texts) / (time.perf_counter() - started)


async def drive(base_url: str, requests: int) -> None:
    """The demo's client side."""
    workload = generate_workload(PROFILES["mixed"], requests + 16, seed=7)
    texts, tokens = list(workload.texts), list(workload.token_counts)
    limits = httpx.Limits(max_connections=128)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        await similarity(client)
        before = scrape(base_url)
        sequential = await one_at_a_time(client, texts[:16], tokens[:16])
        console.print(f"one request at a time: {sequential:.1f} requests/s")
        concurrent = await burst(client, texts[16:], tokens[16:])
        after = scrape(base_url)
    real = after.real_tokens - before.real_tokens
    padded = after.padded_tokens - before.padded_tokens
    console.print(
        f"[bold]dynamic batching: {concurrent / sequential:.1f}x the throughput of one at a "
        f"time[/bold] · padding efficiency {real / max(padded, 1):.2f} (real / padded tokens)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=128, help="size of the burst")
    parser.add_argument("--hold", action="store_true", help="keep serving until Ctrl-C")
    parser.add_argument("--exit", action="store_true", help="exit when done (the default)")
    args = parser.parse_args(argv)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    argv_server = [
        str(Path(sys.executable).with_name("fleetserve-runtime")), "serve",
        "--model", "builtin://minilm-l6", "--name", MODEL, "--version", "v1",
        "--port", str(port), "--device", "cpu", "--threads", "1", "--log-format", "text",
        "--max-batch-size", "32", "--buckets", "auto",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "runtime.log"
        console.print(f"[bold]Starting fleetserve-runtime with MiniLM on {base_url}[/bold] …")
        with running_server(argv_server, base_url=base_url, core=0, log_path=log_path):
            console.print("ready (model loaded, memory measured, buckets warmed)")
            asyncio.run(drive(base_url, args.requests))
            console.print(
                f"Try it: curl -s {base_url}/v2/models/{MODEL} · "
                f"curl -s {base_url}/metrics | grep fleetserve_batch"
            )
            if args.hold:
                console.print("Serving until Ctrl-C …")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    console.print("stopping")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
