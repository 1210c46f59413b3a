"""`make demo-generate`: SmolLM2 in the runtime, one streamed chat answer, then many at once.

Starts `fleetserve-runtime serve --model builtin://smollm2-135m` on a free loopback port
(pinned to one core), streams one chat answer through the official `openai` client as it is
generated, then opens several streams of different lengths at once and shows what continuous
batching did with them: time to first token and inter-token latency per stream, the sequences
that ran together, and the KV-cache and prefix-cache figures from `/metrics`. With `--hold`
the server keeps running until Ctrl-C, for your own `curl -N` or client.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from openai import AsyncOpenAI, OpenAI
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from bench.server_proc import running_server
from fleetserve_runtime.testing.process import free_port

console = Console()
MODEL = "smollm2"
SYSTEM = "You are a concise assistant. Answer in one or two sentences."
QUESTIONS = (
    ("What is the capital of France?", 24),
    ("Name three primary colours.", 32),
    ("Why is the sky blue?", 64),
    ("Write a haiku about the sea.", 48),
    ("What does a compiler do?", 96),
    ("Give one tip for learning to cook.", 40),
    ("What is photosynthesis?", 80),
    ("How many legs does a spider have?", 16),
)


@dataclass(frozen=True)
class Stream:
    """One streamed answer as the client saw it."""

    question: str
    text: str
    ttft_s: float
    gaps_s: tuple[float, ...]
    chunks: int


def chat_once(base_url: str) -> None:
    """Stream one answer to the terminal as the server generates it."""
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    question = "What is the capital of France? Answer in one sentence."
    console.print(f"[bold]user:[/] {question}")
    console.print("[bold]smollm2:[/] ", end="")
    start = time.perf_counter()
    first: float | None = None
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=48,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                first = first if first is not None else time.perf_counter() - start
                console.print(choice.delta.content, end="", markup=False, highlight=False)
    elapsed = time.perf_counter() - start
    console.print()
    if usage is not None and first is not None:
        console.print(
            f"[dim]{usage.prompt_tokens} prompt tokens, {usage.completion_tokens} generated; "
            f"first token after {first * 1000:.0f} ms, "
            f"{usage.completion_tokens / elapsed:.1f} tokens/s for one stream alone[/]"
        )


async def one_stream(client: AsyncOpenAI, question: str, max_tokens: int) -> Stream:
    """Stream `question`'s answer, recording when each chunk arrived."""
    start = time.perf_counter()
    stamps: list[float] = []
    parts: list[str] = []
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                stamps.append(time.perf_counter())
                parts.append(choice.delta.content)
    gaps = tuple(later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False))
    ttft = stamps[0] - start if stamps else float("nan")
    return Stream(question, "".join(parts), ttft, gaps, len(stamps))


async def many_streams(base_url: str) -> list[Stream]:
    """Open every question's stream at once."""
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    async with client:
        return list(await asyncio.gather(*(one_stream(client, q, n) for q, n in QUESTIONS)))


def server_figures(base_url: str) -> dict[str, float]:
    """Totals of the generative series on `/metrics`, summed over their labels."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def show(streams: list[Stream], figures: dict[str, float], wall_s: float) -> None:
    """The per-stream table and what the server counted."""
    table = Table(title=f"{len(streams)} concurrent streams, one core, continuous batching")
    for column in ("question", "chunks", "TTFT ms", "ITL p50 ms", "answer"):
        table.add_column(column, overflow="fold")
    for stream in streams:
        itl = statistics.median(stream.gaps_s) * 1000 if stream.gaps_s else float("nan")
        answer = stream.text.strip().replace("\n", " ")
        table.add_row(
            stream.question,
            str(stream.chunks),
            f"{stream.ttft_s * 1000:.0f}",
            f"{itl:.0f}",
            answer[:70] + ("…" if len(answer) > 70 else ""),
        )
    console.print(table)
    generated = figures.get("fleetserve_generation_tokens_total", 0.0)
    console.print(
        f"server: {generated:.0f} tokens generated in all; {sum(s.chunks for s in streams)} "
        f"streamed here in {wall_s:.1f} s; "
        f"prefix-cache hits {figures.get('fleetserve_prefix_cache_hits_total', 0.0):.0f} of "
        f"{figures.get('fleetserve_prefix_cache_queries_total', 0.0):.0f} prompt tokens "
        "(the shared system prompt); "
        f"preemptions {figures.get('fleetserve_preemptions_total', 0.0):.0f}"
    )


def main() -> int:
    """Run the demo; 0 when every stream answered."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", action="store_true", help="keep the server up until Ctrl-C")
    args = parser.parse_args()
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "fleetserve_runtime",
        "serve",
        "--model",
        "builtin://smollm2-135m",
        "--name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        "1",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "server.log"
        console.print(f"starting {' '.join(argv[2:])} on one core (loading SmolLM2)…")
        with running_server(argv, base_url=base_url, core=1, log_path=log_path):
            chat_once(base_url)
            start = time.perf_counter()
            streams = asyncio.run(many_streams(base_url))
            show(streams, server_figures(base_url), time.perf_counter() - start)
            if args.hold:
                console.print(f"serving at {base_url} (OpenAI API under /v1); Ctrl-C stops")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
    return 0 if all(stream.chunks for stream in streams) else 1


if __name__ == "__main__":
    sys.exit(main())
