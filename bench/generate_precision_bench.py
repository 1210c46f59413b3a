"""Generative precision side by side in one process: SmolLM2 decode in fp32, bf16 and int8.

Loads SmolLM2 once and builds the three models the runtime builds for ``generation.dtype``
``float32``, ``bfloat16`` and ``int8`` (the int8 one through its load-time guard, whose
figures are printed). Each round prefills the same seeded prompts (untimed) into a fresh pool
and times greedy decode steps, at 32 sequences in one batch and at batch 1; the precisions
take turns within every round, so a load spike on a shared machine hits all of them alike,
and each figure is the median over rounds. The model's own step only: no server, scheduler
or sampling (``make bench-generate`` measures those).

The last lines are the speedups; the headline, last, is int8's over fp32's at 32 sequences.

Usage: ``.venv/bin/python -m bench.generate_precision_bench [--rounds N] [--steps N] ...``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Mapping, Sequence

import torch

from fleetserve_runtime.models.causal_lm import SeqChunk, StepInput
from fleetserve_runtime.models.llama.checkpoint import load_checkpoint, smollm2_gguf_path
from fleetserve_runtime.models.llama.int8 import int8_model
from fleetserve_runtime.models.llama.model import LlamaModel

BLOCK_SIZE = 16
BATCHES = (1, 32)


def prompts(count: int, *, vocab: int, seed: int) -> list[list[int]]:
    """`count` seeded prompts of 32 to 256 random tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(32, 256))] for _ in range(count)]


def decode_tokens_per_s(model: LlamaModel, batch: Sequence[Sequence[int]], steps: int) -> float:
    """Prefill `batch` (untimed), then greedy-decode `steps` tokens each; tokens per second."""
    blocks_each = -(-(max(map(len, batch)) + steps) // BLOCK_SIZE)
    model.allocate_cache(blocks_each * len(batch), BLOCK_SIZE)
    tables = [list(range(i * blocks_each, (i + 1) * blocks_each)) for i in range(len(batch))]
    chunks = [SeqChunk(p, 0, t) for p, t in zip(batch, tables, strict=True)]
    nexts = model.forward(StepInput(chunks)).argmax(-1).tolist()
    started = time.perf_counter()
    for step in range(steps):
        chunks = [
            SeqChunk([token], len(p) + step, t)
            for p, t, token in zip(batch, tables, nexts, strict=True)
        ]
        nexts = model.forward(StepInput(chunks)).argmax(-1).tolist()
    return len(batch) * steps / (time.perf_counter() - started)


def ratio_lines(medians: Mapping[tuple[str, int], float]) -> list[str]:
    """The speedup lines, the headline (int8 over fp32 at 32 sequences) last."""
    pairs = (("bf16", "fp32"), ("int8", "bf16"), ("int8", "fp32"))
    return [
        f"generate_{head}_speedup_vs_{base}_batch{batch}="
        f"{medians[(head, batch)] / medians[(base, batch)]:.2f}"
        for batch in BATCHES
        for head, base in pairs
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Build the three models, run the rounds, print the table and the speedups."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16, help="decode steps per measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    checkpoint = load_checkpoint(smollm2_gguf_path())
    cpu = torch.device("cpu")

    def build(dtype: torch.dtype) -> LlamaModel:
        return LlamaModel(checkpoint.config, checkpoint.weights, device=cpu, dtype=dtype)

    int8, report = int8_model(build(torch.float32), checkpoint.codec, cpu)
    models = {"fp32": build(torch.float32), "bf16": build(torch.bfloat16), "int8": int8}
    print(
        f"int8 guard: top-1 agreement {report.top1_agreement:.3f}, "
        f"largest logit error {report.max_logit_error:.2f}"
    )
    batch = prompts(max(BATCHES), vocab=checkpoint.config.vocab_size, seed=args.seed)
    samples: dict[tuple[str, int], list[float]] = {}
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for size in BATCHES:
            for name, model in models.items():
                rate = decode_tokens_per_s(model, batch[:size], args.steps)
                samples.setdefault((name, size), []).append(rate)
    medians = {key: statistics.median(rates) for key, rates in samples.items()}
    print(
        f"torch threads {args.threads}, load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    for size in BATCHES:
        row = ", ".join(f"{name} {medians[(name, size)]:.1f}" for name in models)
        print(f"decode tokens/s at {size} sequences: {row}")
    for line in ratio_lines(medians):
        print(line)


if __name__ == "__main__":
    main()
