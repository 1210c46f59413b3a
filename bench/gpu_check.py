"""``make gpu-check``: run the runtime's CUDA paths on a real GPU and say which hold.

Each check prints one line, ``check <name>: PASS|FAIL <figures>``; the last line is
``gpu_check=pass|fail`` and the exit status is non-zero on a failure. Without CUDA it prints
why, then ``gpu_check=skipped``, and exits 0 at once. About 3-6 minutes on one H200
(model loads, three benchmark servers); every check has a time limit.

The checks:

* ``precision``: MiniLM embeddings in bf16 (the served ``precision: bf16``, accuracy guard
  included) and fp16 (the encoder cast by hand) against fp32, minimum cosine ≥ 0.99;
* ``overlap``: concurrent requests through the executor's two-stream pipeline (collate and
  host-to-device copy on their own stream, compute waiting on its event), every embedding
  equal (cosine ≥ 0.999) to the same text embedded alone;
* ``calibration``: the memory profile the CUDA allocator measured at load predicts the peak
  bytes of a fresh 32 x 256-token batch within a factor of two;
* ``oom_split``: device memory filled by a ballast tensor until a 64-request batch cannot
  fit; the real CUDA OOM must split it (``fleetserve_oom_splits_total`` rises) and every
  request be answered with its correct embedding;
* ``batching``: ``bench.runtime_bench`` with the server on CUDA, its ratios printed;
  passes when batching beats batch size 1;
* ``generation``: SmolLM2 greedy in bf16 against fp32, token by token; passes when every
  prompt agrees on the first ``--agree-tokens`` tokens, and prints where each diverges.

Usage: ``.venv/bin/python -m bench.gpu_check [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from fleetserve_runtime.cli import main as serve_cli
from fleetserve_runtime.core.memory import measure_bytes
from fleetserve_runtime.core.metrics import LABELS
from fleetserve_runtime.generate.contracts import (
    ErrorEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from fleetserve_runtime.models.accuracy import Precision, PrecisionOptions, embed_texts
from fleetserve_runtime.models.minilm import MiniLMHandler
from fleetserve_runtime.serving.runtime import InferenceCall, Runtime
from fleetserve_runtime.testing import make_config

SERVE_ON_CUDA = "--serve-on-cuda"
"""First argument that makes this module a `fleetserve-runtime` on CUDA (for the bench)."""

MINILM = "builtin://minilm-l6"
SMOLLM2 = "builtin://smollm2-135m"
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "A list of three colours: red,",
)
TEXTS = (
    "How do I reset my password?",
    "The quick brown fox jumps over the lazy dog.",
    "Kubernetes schedules pods onto nodes according to their resource requests.",
    "Ein kurzer deutscher Satz über das Wetter.",
    "Embeddings map texts to vectors whose cosine says how similar they are.",
)


@dataclass(frozen=True)
class GpuCheckResult:
    """One check's verdict and the figures behind it."""

    ok: bool
    summary: str


Check = Callable[[argparse.Namespace], Awaitable[GpuCheckResult]]


def _cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """Row-wise cosine similarity of two `[n, dim]` arrays."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dots = np.sum(a64 * b64, axis=1)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    result: npt.NDArray[np.float64] = dots / np.maximum(norms, 1e-12)
    return result


async def check_precision(args: argparse.Namespace) -> GpuCheckResult:
    """bf16 (served path, guard included) and fp16 (cast) MiniLM against fp32."""
    device = torch.device(args.device)

    def embed(precision: Precision, cast: torch.dtype | None) -> npt.NDArray[np.float32]:
        handler = MiniLMHandler("gpu-check", "v1", precision=PrecisionOptions(precision))
        handler.load(device)
        if cast is not None:
            handler.encoder.to(cast)
        with torch.inference_mode():
            return embed_texts(handler, TEXTS, device)

    reference = await asyncio.to_thread(embed, "fp32", None)
    bf16 = _cosines(reference, await asyncio.to_thread(embed, "bf16", None)).min()
    fp16 = _cosines(reference, await asyncio.to_thread(embed, "fp32", torch.float16)).min()
    ok = bool(bf16 >= 0.99 and fp16 >= 0.99)
    return GpuCheckResult(ok, f"min_cosine bf16={bf16:.6f} fp16={fp16:.6f} (floor 0.99)")


async def _served_minilm(
    args: argparse.Namespace, run: Callable[[Runtime], Awaitable[GpuCheckResult]]
) -> GpuCheckResult:
    """Start an in-process runtime serving MiniLM on the device, run `run(runtime)`, stop it."""
    config = make_config(
        model=MINILM,
        device=args.device,
        warmup=True,
        batching={"max_batch_size": 64, "max_queue_delay_ms": 5},
        queue={"max_queue_size": 8192, "default_timeout_ms": 60_000, "max_timeout_ms": 60_000},
    )
    runtime = Runtime(config)
    await runtime.start()
    try:
        await runtime.wait_ready()
        return await run(runtime)
    finally:
        await runtime.stop()


async def _embed_alone(runtime: Runtime, texts: Sequence[str]) -> npt.NDArray[np.float32]:
    """Each text as its own request, one after the other (batches of one)."""
    rows = []
    for text in texts:
        result = await runtime.infer(InferenceCall(instances=[text], truncate=True))
        rows.append(np.asarray(result.results[0], dtype=np.float32))
    return np.stack(rows)


async def check_overlap(args: argparse.Namespace) -> GpuCheckResult:
    """Concurrent requests through the two-stream pipeline equal each text embedded alone."""
    texts = [f"{TEXTS[n % len(TEXTS)]} (variant {n})" for n in range(args.overlap_requests)]

    async def run(runtime: Runtime) -> GpuCheckResult:
        alone = await _embed_alone(runtime, texts[:64])
        started = time.perf_counter()
        results = await asyncio.gather(
            *(runtime.infer(InferenceCall(instances=[t], truncate=True)) for t in texts)
        )
        elapsed = time.perf_counter() - started
        rows = np.stack([np.asarray(r.results[0], dtype=np.float32) for r in results[:64]])
        worst = float(_cosines(alone, rows).min())
        sizes = [r.timings.batch_size for r in results]
        return GpuCheckResult(
            worst >= 0.999,
            f"{len(texts)} requests in {elapsed:.2f}s ({len(texts) / elapsed:.0f} req/s), "
            f"max batch {max(sizes)}, min cosine to batch-of-one {worst:.5f}",
        )

    return await _served_minilm(args, run)


async def check_calibration(args: argparse.Namespace) -> GpuCheckResult:
    """The allocator-measured memory profile predicts a fresh batch's peak bytes."""

    async def run(runtime: Runtime) -> GpuCheckResult:
        loaded = runtime.model(None)
        profile = loaded.memory
        if profile is None:
            return GpuCheckResult(False, "no memory profile was measured at load")
        handler = loaded.handler
        text = handler.sample_instance(256)
        assert isinstance(text, str)
        device = torch.device(args.device)

        def batch() -> None:
            with torch.inference_mode():
                embed_texts(handler, [text] * 32, device)

        peak, _ = await asyncio.to_thread(measure_bytes, batch, device)
        tokens = 32 * handler.preprocess(text, truncate=True).length
        predicted = profile.weights_bytes + profile.batch_bytes(tokens)
        ratio = peak / max(predicted, 1)
        return GpuCheckResult(
            0.5 <= ratio <= 2.0 and profile.bytes_per_token > 0,
            f"weights {profile.weights_bytes / 2**20:.1f} MiB, fixed "
            f"{profile.fixed_bytes / 2**20:.1f} MiB, {profile.bytes_per_token:.0f} B/token; "
            f"32x256 batch peak {peak / 2**20:.1f} MiB vs predicted {predicted / 2**20:.1f} MiB "
            f"(ratio {ratio:.2f}, accepted 0.5-2.0)",
        )

    return await _served_minilm(args, run)


async def check_oom_split(args: argparse.Namespace) -> GpuCheckResult:
    """A real CUDA OOM (memory filled by a ballast) splits the batch; all answered right."""
    if args.device != "cuda":
        return GpuCheckResult(False, "needs CUDA: the OOM must be the CUDA allocator's own")

    async def run(runtime: Runtime) -> GpuCheckResult:
        loaded = runtime.model(None)
        profile = loaded.memory
        if profile is None:
            return GpuCheckResult(False, "no memory profile was measured at load")
        text = loaded.handler.sample_instance(256)
        assert isinstance(text, str)
        texts = [f"{n} {text}" for n in range(64)]
        alone = await _embed_alone(runtime, texts[:4])
        tokens = 64 * loaded.handler.preprocess(text, truncate=True).length
        need = profile.batch_bytes(tokens)
        labels = dict(zip(LABELS, runtime.metrics.labels(loaded.version), strict=True))
        before = runtime.metrics.registry.get_sample_value("fleetserve_oom_splits_total", labels)
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        # Leave room for about 60% of the full batch: it fails, its halves fit.
        ballast = torch.empty(max(0, free - int(0.6 * need)), dtype=torch.uint8, device="cuda")
        try:
            result = await runtime.infer(InferenceCall(instances=texts, truncate=True))
        finally:
            del ballast
            torch.cuda.empty_cache()
        after = runtime.metrics.registry.get_sample_value("fleetserve_oom_splits_total", labels)
        splits = (after or 0.0) - (before or 0.0)
        rows = np.stack([np.asarray(r, dtype=np.float32) for r in result.results[:4]])
        worst = float(_cosines(alone, rows).min())
        return GpuCheckResult(
            splits >= 1 and worst >= 0.999 and len(result.results) == len(texts),
            f"batch of {len(texts)} x {tokens // len(texts)} tokens (~{need / 2**20:.0f} MiB of "
            f"activations) with ~{0.6 * need / 2**20:.0f} MiB free: {splits:.0f} split(s), "
            f"{len(result.results)} answered, min cosine to batch-of-one {worst:.5f}",
        )

    return await _served_minilm(args, run)


async def check_batching(args: argparse.Namespace) -> GpuCheckResult:
    """`bench.runtime_bench` with its servers on CUDA; passes when batching beats batch 1."""
    server = f"{shlex.quote(sys.executable)} -m bench.gpu_check {SERVE_ON_CUDA}"
    on_cuda = [f"--runtime={server}"] if args.device == "cuda" else []
    command = [
        sys.executable,
        "-m",
        "bench.runtime_bench",
        *on_cuda,
        f"--requests={args.bench_requests}",
        f"--warmup={args.bench_warmup}",
        "--time-limit-s=120",
    ]
    done = await asyncio.to_thread(
        subprocess.run,
        command,
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=args.bench_timeout_s,
        check=False,
    )
    if done.returncode != 0:
        return GpuCheckResult(
            False, f"runtime_bench exited {done.returncode}: {done.stderr[-400:]!r}"
        )
    figures = dict(
        line.split("=", 1) for line in done.stdout.splitlines() if "=" in line and " " not in line
    )
    print(done.stdout, flush=True)
    speedup = float(figures.get("batching_speedup", "0"))
    shown = ", ".join(f"{key}={value}" for key, value in figures.items())
    return GpuCheckResult(speedup > 1.0, shown)


async def _greedy(device: str, dtype: str, max_tokens: int) -> list[list[int]]:
    """SmolLM2's greedy token ids for every prompt, served on `device` in `dtype`."""
    config = make_config(model=SMOLLM2, device=device, generation={"dtype": dtype})
    runtime = Runtime(config)
    await runtime.start()
    outputs: list[list[int]] = []
    try:
        await runtime.wait_ready()
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        for prompt in PROMPTS:
            stream = await runtime.generate(GenerationRequest(sampling=sampling, prompt=prompt))
            tokens: list[int] = []
            async for event in stream:
                if isinstance(event, ErrorEvent):
                    raise event.error
                if isinstance(event, TokenEvent):
                    tokens.extend(event.token_ids)
            outputs.append(tokens)
    finally:
        await runtime.stop()
    return outputs


def _divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token; None when the shorter is a prefix of the other."""
    return next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


async def check_generation(args: argparse.Namespace) -> GpuCheckResult:
    """SmolLM2 greedy in bf16 against fp32: where (if anywhere) each prompt diverges."""
    reference = await _greedy(args.device, "float32", args.generate_tokens)
    candidate = await _greedy(args.device, "bfloat16", args.generate_tokens)
    points = [_divergence(a, b) for a, b in zip(reference, candidate, strict=True)]
    ok = all(
        len(b) >= args.agree_tokens and (point is None or point >= args.agree_tokens)
        for b, point in zip(candidate, points, strict=True)
    )
    shown = ", ".join(
        f"prompt {n}: {'equal' if p is None else f'diverges at token {p}'}"
        for n, p in enumerate(points)
    )
    return GpuCheckResult(ok, f"{args.generate_tokens} tokens each; {shown}")


CHECKS: dict[str, Check] = {
    "precision": check_precision,
    "overlap": check_overlap,
    "calibration": check_calibration,
    "oom_split": check_oom_split,
    "batching": check_batching,
    "generation": check_generation,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--only", action="append", choices=sorted(CHECKS), help="repeatable")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a dry run of the checks' own logic (not oom_split), for development",
    )
    parser.add_argument("--check-timeout-s", type=float, default=150.0)
    parser.add_argument("--overlap-requests", type=int, default=2048)
    parser.add_argument("--bench-requests", type=int, default=1000)
    parser.add_argument("--bench-warmup", type=int, default=128)
    parser.add_argument("--bench-timeout-s", type=float, default=240.0)
    parser.add_argument("--generate-tokens", type=int, default=64)
    parser.add_argument("--agree-tokens", type=int, default=8)
    return parser.parse_args(argv)


async def run_checks(args: argparse.Namespace) -> bool:
    """Run the chosen checks in order, one line each; True when all passed."""
    passed = True
    for name in args.only or CHECKS:
        started = time.perf_counter()
        limit = args.bench_timeout_s + 30 if name == "batching" else args.check_timeout_s
        try:
            outcome = await asyncio.wait_for(CHECKS[name](args), limit)
        except Exception as exc:  # a check that raised failed; the others still run
            outcome = GpuCheckResult(False, f"{type(exc).__name__}: {str(exc)[:300]}")
        verdict = "PASS" if outcome.ok else "FAIL"
        took = time.perf_counter() - started
        print(f"check {name}: {verdict} {outcome.summary} [{took:.0f}s]", flush=True)
        passed = passed and outcome.ok
    return passed


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks (or serve on CUDA for the benchmark); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [SERVE_ON_CUDA]:
        # The benchmark's flags say cpu and one thread; the last flag given wins.
        return serve_cli([*argv[1:], "--device=cuda"])
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: the GPU checks were not run")
        print("gpu_check=skipped")
        return 0
    shown = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (dry run)"
    print(f"device: {shown}, torch {torch.__version__}", flush=True)
    passed = asyncio.run(run_checks(args))
    print(f"gpu_check={'pass' if passed else 'fail'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
