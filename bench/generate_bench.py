"""``make bench-generate``: generative serving measured side by side in one run.

Starts each server on 127.0.0.1, once per configuration and each time in a fresh process
pinned to the server core with one torch thread, and drives it from the client core with the
same seeded workload: 32 concurrent streaming clients (closed loop) on ``/v1/completions``,
prompts of 20–400 tokens and outputs of 16–256 tokens, both long-tailed (clipped lognormal).
Every request asks for an exact output length, so that every configuration generates the same
tokens:

(a) fleetserve-runtime, continuous batching (up to 32 running sequences);
(b) the same server with one running sequence (batch 1);
(c) the same server with static batching (a batch of up to 32 runs to completion before
    the next is admitted);
(d) the peer: ``transformers serve`` with its continuous batching, on the same weights
    (SmolLM2's GGUF, dequantised to fp32 and saved as a transformers checkpoint once);
(e) the CPU peer: llama.cpp's ``llama-server`` (built once by ``bench.llamacpp.build``) on the
    very GGUF file our runtime loads, one thread, 32 parallel slots, continuous batching;
(f) (a) in bfloat16 (``generation.dtype``): not token-identical to the fp32 reference, as
    llama.cpp's quantised weights are not, and the fair match for (e) on a CPU with bf16 units;
(g) (a) in int8 (``generation.dtype``: int8 projections over fp32 activations, guarded
    against fp32 at load), for CPUs with VNNI.

Our runtime and llama.cpp get ``ignore_eos: true``; ``transformers serve`` gets the same effect
from its ``generation_config`` extension field with ``eos_token_id: -1``, and each
configuration's ``short`` column counts the streams that still stopped early. Figures per
configuration: generated tokens per second of wall time, time to first token and inter-token
latency (p50/p99, see ``bench.stream_load``). The last six lines are the speedups of (a) over
(b), (c), (d), then of (g), (f) and (a) over (e).

Usage: ``.venv/bin/python -m bench.generate_bench [--quick] [--requests N] ...``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table

from bench.llamacpp.build import ensure_llama_server, pinned_version
from bench.pinning import pin_current_process
from bench.server_proc import process_cpu_seconds, running_server, runtime_serve_argv
from bench.stream_load import StreamRequest, StreamStats, run_streaming_closed_loop
from fleetserve_runtime.models.llama.checkpoint import smollm2_gguf_path
from fleetserve_runtime.testing.process import free_port

#: The name our runtime serves the model under.
MODEL_NAME = "smollm2"

#: Where the dequantised transformers checkpoint of SmolLM2 is kept between runs.
DEFAULT_PEER_MODEL_DIR = Path.home() / ".cache" / "fleetserve" / "smollm2-135m-instruct-hf"

ServerKind = Literal["fleetserve", "transformers", "llamacpp"]


@dataclass(frozen=True)
class TokenLengths:
    """A clipped lognormal distribution of token counts: most short, a long tail.

    Attributes:
        median: Median before clipping, in tokens.
        sigma: Standard deviation of the log.
        low: Smallest value.
        high: Largest value.
    """

    median: float
    sigma: float
    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        """Draw one token count."""
        drawn = round(rng.lognormvariate(math.log(self.median), self.sigma))
        return min(max(drawn, self.low), self.high)


#: Prompt lengths: a question with some context; about 4 % hit the 400-token clip.
PROMPT_LENGTHS = TokenLengths(median=120, sigma=0.7, low=20, high=400)
#: Output lengths: short answers mostly, a tail of long ones (mean about 80 tokens).
OUTPUT_LENGTHS = TokenLengths(median=64, sigma=0.7, low=16, high=256)

#: Byte-level BPE vocabulary entries that are one lowercase word after a space.
_SPACE_WORD = re.compile("\u0120([a-z]{3,10})")


def single_token_words(vocab: Mapping[str, int]) -> tuple[str, ...]:
    """Return the words that the tokenizer encodes, after a space, as exactly one token.

    A prompt of N such words, each preceded by a space, is N tokens long: the byte-level
    pre-tokenizer splits at the spaces, so no merge crosses two words.
    """
    return tuple(sorted(m[1] for entry in vocab if (m := _SPACE_WORD.fullmatch(entry))))


@dataclass(frozen=True)
class StreamWorkItem:
    """One request of the workload.

    Attributes:
        prompt: The prompt text.
        prompt_tokens: Its length in tokens.
        max_tokens: The exact number of tokens to generate.
    """

    prompt: str
    prompt_tokens: int
    max_tokens: int


def generate_workload(count: int, *, seed: int, words: Sequence[str]) -> tuple[StreamWorkItem, ...]:
    """Return ``count`` seeded requests with lengths from the two profiles.

    Args:
        count: Requests to generate.
        seed: Seed; the same seed and words give the same requests.
        words: Single-token words (``single_token_words``) the prompts are made of.
    """
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        prompt_tokens = PROMPT_LENGTHS.sample(rng)
        max_tokens = OUTPUT_LENGTHS.sample(rng)
        prompt = "".join(f" {rng.choice(words)}" for _ in range(prompt_tokens))
        items.append(
            StreamWorkItem(prompt=prompt, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        )
    return tuple(items)


def request_body(item: StreamWorkItem, *, kind: ServerKind, model: str) -> bytes:
    """Return the streaming ``/v1/completions`` body for ``item`` in a server's dialect.

    All ask for greedy decoding of exactly ``max_tokens`` tokens: our runtime and llama.cpp
    through ``ignore_eos`` (as vLLM spells it), ``transformers serve`` through its
    ``generation_config`` field, whose ``eos_token_id: -1`` matches no token.
    """
    body: dict[str, object] = {
        "model": model,
        "prompt": item.prompt,
        "max_tokens": item.max_tokens,
        "stream": True,
    }
    if kind in ("fleetserve", "llamacpp"):
        body |= {"temperature": 0.0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    else:
        body["generation_config"] = json.dumps({"eos_token_id": -1, "do_sample": False})
    return json.dumps(body).encode("utf-8")


@dataclass(frozen=True)
class StreamServerConfig:
    """One server configuration under test.

    Attributes:
        label: Short name ("a" … "d").
        description: What the configuration does.
        kind: Which server it is.
        args: Options that set it apart; the common ones come from ``server_argv``.
    """

    label: str
    description: str
    kind: ServerKind
    args: tuple[str, ...]


CONFIGS = (
    StreamServerConfig(
        "a",
        "fleetserve continuous, 32 running",
        "fleetserve",
        ("--generation-policy=continuous", "--generation-max-running-sequences=32"),
    ),
    StreamServerConfig(
        "b",
        "fleetserve batch 1",
        "fleetserve",
        ("--generation-policy=continuous", "--generation-max-running-sequences=1"),
    ),
    StreamServerConfig(
        "c",
        "fleetserve static, batch 32",
        "fleetserve",
        ("--generation-policy=static", "--generation-max-running-sequences=32"),
    ),
    StreamServerConfig(
        "d", "transformers serve, continuous", "transformers", ("--continuous-batching",)
    ),
    StreamServerConfig(
        "e",
        "llama.cpp llama-server, 32 slots",
        "llamacpp",
        ("--parallel", "32", "--cont-batching"),
    ),
    StreamServerConfig(
        "f",
        "fleetserve continuous, 32 running, bf16",
        "fleetserve",
        (
            "--generation-policy=continuous",
            "--generation-max-running-sequences=32",
            "--generation-dtype=bfloat16",
        ),
    ),
    StreamServerConfig(
        "g",
        "fleetserve continuous, 32 running, int8",
        "fleetserve",
        (
            "--generation-policy=continuous",
            "--generation-max-running-sequences=32",
            "--generation-dtype=int8",
        ),
    ),
)

#: Readiness path of each server kind.
READY_PATHS: Mapping[ServerKind, str] = {
    "fleetserve": "/v2/health/ready",
    "transformers": "/health",
    "llamacpp": "/health",
}


def peer_num_blocks(*, concurrency: int, block_size: int) -> int:
    """Return KV blocks enough for ``concurrency`` sequences of the longest prompt and output.

    Sized so that the peer never has to evict, as our runtime's pool never has to at the
    same concurrency; left to itself on CPU it sizes its cache from host memory.
    """
    per_sequence = math.ceil((PROMPT_LENGTHS.high + OUTPUT_LENGTHS.high) / block_size)
    return concurrency * per_sequence


def server_argv(config: StreamServerConfig, *, port: int, args: argparse.Namespace) -> list[str]:
    """Return the full command line of ``config``'s server on ``port``."""
    if config.kind == "fleetserve":
        runtime = shlex.split(args.runtime)
        # A stream's deadline is the generation section's: the whole answer, like the client's.
        timeout_ms = int(args.request_timeout_s * 1000)
        return [
            *runtime_serve_argv(runtime, model=args.model, name=MODEL_NAME, port=port),
            "--log-level=warning",
            "--max-queue-size=4096",
            f"--generation-default-timeout-ms={timeout_ms}",
            f"--generation-max-timeout-ms={timeout_ms}",
            # Exact output lengths: the benchmark asks for `ignore_eos`, off by default.
            "--generation-allow-ignore-eos",
            f"--generation-block-size={args.block_size}",
            f"--generation-max-step-tokens={args.max_step_tokens}",
            *config.args,
        ]
    block = args.block_size
    kv_tokens = peer_num_blocks(concurrency=args.concurrency, block_size=block) * block
    if config.kind == "llamacpp":
        # llama.cpp's parser turns `_` into `-` in a `--flag=value` word, value included (a
        # path): every value is its own word.
        return [
            str(args.llama_server),
            *("--model", str(smollm2_gguf_path())),
            *config.args,
            # The context is shared by the slots: each gets the longest prompt and output.
            *("--ctx-size", str(kv_tokens)),
            *("--batch-size", str(args.max_step_tokens)),
            *("--ubatch-size", str(args.max_step_tokens)),
            # One core, as our server: generation and prompt processing on one thread each.
            *("--threads", "1"),
            *("--threads-batch", "1"),
            "--no-webui",
            *("--host", "127.0.0.1"),
            *("--port", str(port)),
        ]
    return [
        *shlex.split(args.peer),
        "serve",
        str(args.peer_model_dir),
        *config.args,
        f"--cb-block-size={block}",
        f"--cb-num-blocks={peer_num_blocks(concurrency=args.concurrency, block_size=block)}",
        f"--cb-max-batch-tokens={args.max_step_tokens}",
        "--device=cpu",
        "--dtype=float32",
        "--host=127.0.0.1",
        f"--port={port}",
    ]


def export_peer_checkpoint(target: Path) -> Path:
    """Save SmolLM2's GGUF as a transformers checkpoint at ``target``, unless it is there.

    transformers dequantises the GGUF with its own loader, so the peer runs on exactly the
    weights transformers itself reads from the file. ``from_pretrained(gguf_file=...)`` would
    mark the model as GGUF-quantised, which ``save_pretrained`` refuses; the tensors are
    loaded into a plain fp32 model instead. The directory appears whole or not at all.
    """
    if (target / "config.json").is_file():
        return target
    # transformers is a development dependency: imported only when the export is needed.
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = smollm2_gguf_path()
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # `transformers serve` picks the model class from this field.
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config)
    # transformers leaves its GGUF reader unannotated.
    tensors = load_gguf_checkpoint(  # type: ignore[no-untyped-call]
        str(gguf), return_tensors=True, model_to_load=model
    )
    missing = model.load_state_dict(tensors["tensors"], strict=False).missing_keys
    # The GGUF stores the tied embedding once; tie_weights fills the output projection.
    if set(missing) - {"lm_head.weight"} or (missing and not config.tie_word_embeddings):
        raise RuntimeError(f"GGUF export: weights missing from the file: {missing}")
    model.tie_weights()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(
            staging
        )
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_words(model_dir: Path) -> tuple[str, ...]:
    """Return the single-token words of SmolLM2's tokenizer (``tokenizer.json`` in the export)."""
    from tokenizers import Tokenizer

    return single_token_words(Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab())


def check_prompt_lengths(items: Sequence[StreamWorkItem], model_dir: Path) -> None:
    """Fail unless every prompt is exactly as many tokens long as the workload says.

    Raises:
        RuntimeError: Naming the first prompt whose length differs.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for index, item in enumerate(items):
        measured = len(tokenizer.encode(item.prompt, add_special_tokens=False).ids)
        if measured != item.prompt_tokens:
            msg = f"prompt {index}: {measured} tokens, the workload says {item.prompt_tokens}"
            raise RuntimeError(msg)


@dataclass(frozen=True)
class StreamConfigResult:
    """What one configuration achieved in the measured window.

    Attributes:
        label: Short name.
        description: What the configuration does.
        argv: The server's full command line.
        stats: The client's figures.
        server_cpu_util: Server CPU-seconds per wall second (near 1: it owned its core).
    """

    label: str
    description: str
    argv: tuple[str, ...]
    stats: StreamStats
    server_cpu_util: float


def stream_requests(
    items: Sequence[StreamWorkItem], *, kind: ServerKind, model: str
) -> list[StreamRequest]:
    """The streaming requests of ``items`` for a server of ``kind`` serving ``model``."""
    return [StreamRequest(request_body(i, kind=kind, model=model), i.max_tokens) for i in items]


def measure_config(
    config: StreamServerConfig,
    workload: Sequence[StreamWorkItem],
    warmup: Sequence[StreamWorkItem],
    *,
    args: argparse.Namespace,
    log_dir: Path,
) -> StreamConfigResult:
    """Start a fresh server for ``config``, warm it up, and measure one closed-loop run."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    url = f"{base_url}/v1/completions"
    model = MODEL_NAME if config.kind == "fleetserve" else str(args.peer_model_dir)

    def run(items: Sequence[StreamWorkItem], time_limit_s: float) -> StreamStats:
        return asyncio.run(
            run_streaming_closed_loop(
                url,
                stream_requests(items, kind=config.kind, model=model),
                concurrency=args.concurrency,
                time_limit_s=time_limit_s,
                request_timeout_s=args.request_timeout_s,
            )
        )

    argv = server_argv(config, port=port, args=args)
    with running_server(
        argv,
        base_url=base_url,
        core=args.server_core,
        log_path=log_dir / f"server-{config.label}.log",
        ready_path=READY_PATHS[config.kind],
    ) as pid:
        warm = run(warmup, args.request_timeout_s)
        if warm.finished != len(warmup):
            msg = f"({config.label}) warm-up failed: {warm.status_counts} {dict(warm.errors)}"
            raise RuntimeError(msg)
        cpu_before = process_cpu_seconds(pid)
        stats = run(workload, args.time_limit_s)
        cpu_s = process_cpu_seconds(pid) - cpu_before
    return StreamConfigResult(
        label=config.label,
        description=config.description,
        argv=tuple(argv),
        stats=stats,
        server_cpu_util=cpu_s / stats.elapsed_s if stats.elapsed_s > 0 else 0.0,
    )


def speedup(head: StreamConfigResult | None, base: StreamConfigResult | None) -> float:
    """Return ``head``'s tokens per second over ``base``'s.

    NaN if either configuration was not run, or ``base`` generated nothing.
    """
    if head is None or base is None or base.stats.tokens_per_s <= 0:
        return math.nan
    return head.stats.tokens_per_s / base.stats.tokens_per_s


def _table(results: Sequence[StreamConfigResult]) -> Table:
    """Return the side-by-side table of the configurations."""
    table = Table(title="generation, 32 streaming clients, server on one core")
    columns = ("config", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "ok/sent")
    for column in (*columns, "short", "resent", "srv cpu"):
        table.add_column(column, justify="left" if column == "config" else "right")
    for r in results:
        s = r.stats
        table.add_row(
            f"({r.label}) {r.description}",
            f"{s.tokens_per_s:.1f}",
            f"{s.ttft_p50_ms:.0f} ms",
            f"{s.ttft_p99_ms:.0f} ms",
            f"{s.itl_p50_ms:.1f} ms",
            f"{s.itl_p99_ms:.1f} ms",
            f"{s.finished}/{s.sent}",
            str(s.short_streams),
            str(s.resent),
            f"{r.server_cpu_util:.2f}",
        )
    return table


def print_report(results: Sequence[StreamConfigResult], *, context: Mapping[str, object]) -> None:
    """Print the table, the JSON of everything, and the six speedup lines last."""
    by_label = {r.label: r for r in results}
    Console(width=130).print(_table(results))
    document = {"context": dict(context), "results": [asdict(r) for r in results]}
    print(json.dumps(document, indent=2, default=str))
    for name, base in (("batch1", "b"), ("static", "c"), ("peer", "d")):
        print(f"generate_speedup_vs_{name}={speedup(by_label.get('a'), by_label.get(base)):.2f}")
    print(f"generate_int8_speedup_vs_llamacpp={speedup(by_label.get('g'), by_label.get('e')):.2f}")
    print(f"generate_bf16_speedup_vs_llamacpp={speedup(by_label.get('f'), by_label.get('e')):.2f}")
    # The headline: our token-exact fp32 engine against llama.cpp on the same file and core.
    print(f"generate_speedup_vs_llamacpp={speedup(by_label.get('a'), by_label.get('e')):.2f}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; ``--quick`` shrinks the run to a smoke test."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    bin_dir = Path(sys.executable).parent
    parser.add_argument("--runtime", default=str(bin_dir / "fleetserve-runtime"))
    parser.add_argument("--model", default="builtin://smollm2-135m")
    parser.add_argument("--peer", default=str(bin_dir / "transformers"), help="peer command")
    parser.add_argument("--peer-model-dir", type=Path, default=DEFAULT_PEER_MODEL_DIR)
    parser.add_argument(
        "--llama-server",
        type=Path,
        default=None,
        help="llama.cpp server binary (default: built and cached by bench.llamacpp.build)",
    )
    parser.add_argument("--requests", type=int, default=None, help="measured requests")
    parser.add_argument("--warmup", type=int, default=None, help="unmeasured requests")
    parser.add_argument("--quick", action="store_true", help="8 requests: a smoke test")
    parser.add_argument("--concurrency", type=int, default=32, help="streaming clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=16, help="KV block size (both)")
    parser.add_argument("--max-step-tokens", type=int, default=512, help="tokens per step")
    parser.add_argument("--configs", default="abcdefg", help="labels to run, e.g. 'ae'")
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--time-limit-s", type=float, default=600.0, help="per measured run")
    parser.add_argument("--request-timeout-s", type=float, default=600.0, help="per stream")
    args = parser.parse_args(argv)
    if args.requests is None:
        args.requests = 8 if args.quick else 128
    if args.warmup is None:
        args.warmup = 2 if args.quick else 4
    return args


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM (``timeout``, a CI runner) into SystemExit, so the server is stopped."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> None:
    """Run every configuration and print the report."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # The peer must never reach for the Hub; everything it needs is in the exported directory.
    os.environ["HF_HUB_OFFLINE"] = "1"
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    if "e" in args.configs and args.llama_server is None:
        args.llama_server = ensure_llama_server()
    model_dir = export_peer_checkpoint(args.peer_model_dir)
    words = load_words(model_dir)
    items = generate_workload(args.warmup + args.requests, seed=args.seed, words=words)
    check_prompt_lengths(items, model_dir)
    warmup, workload = items[: args.warmup], items[args.warmup :]
    pin_current_process(args.client_core)
    results: list[StreamConfigResult] = []
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-generate-") as log_dir:
        for config in CONFIGS:
            if config.label in args.configs:
                results.append(
                    measure_config(config, workload, warmup, args=args, log_dir=Path(log_dir))
                )
    context = {
        **vars(args),
        "prompt_tokens": sum(i.prompt_tokens for i in workload),
        "requested_tokens": sum(i.max_tokens for i in workload),
        "wall_s": round(time.perf_counter() - started, 1),
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        # The sdist whose vendored llama.cpp the peer's server was built from.
        "llama_cpp_python": pinned_version(),
        "cpus": os.cpu_count(),
        # A load average far above the two busy cores of this benchmark: not alone.
        "loadavg_1m_start": load_before,
        "loadavg_1m_end": os.getloadavg()[0],
    }
    print_report(results, context=context)


if __name__ == "__main__":
    main()
