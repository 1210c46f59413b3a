"""Generative precision side by side in one process: SmolLM2 decode in fp32, bf16 and int8.

Loads SmolLM2 once and builds the three models the runtime builds for ``generation.dtype``
``float32``, ``bfloat16`` and ``int8`` (the int8 one through its load-time guard, whose
figures are printed). Each model prefills the same 32 seeded prompts once (untimed); each
round then times greedy decode steps from that state, at 32 sequences in one batch and at
batch 1 (the first sequence), overwriting the same slots every round. The precisions take
turns within every round, so a load spike on a shared machine hits all of them alike, and
each figure is the median over rounds. The model's own step only: no server, scheduler
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
from dataclasses import dataclass

import torch

from fleetserve_runtime.models.causal_lm import SeqChunk, StepInput
from fleetserve_runtime.models.llama.checkpoint import load_checkpoint, smollm2_gguf_path
from fleetserve_runtime.models.llama.int8 import int8_model
from fleetserve_runtime.models.llama.model import LlamaModel

BLOCK_SIZE = 16
BATCHES = (1, 32)


def prompts(count: int, *, vocab: int, seed: int) -> list[list[int]]:
    """`count` seeded prompts of 16 to 128 random tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(16, 128))] for _ in range(count)]


@dataclass(frozen=True, slots=True)
class Prefilled:
    """Prompts whose keys and values sit in the model's pool, and each one's next token."""

    prompts: list[list[int]]
    tables: list[list[int]]
    first_tokens: list[int]


def prefill(model: LlamaModel, prompts: list[list[int]], steps: int) -> Prefilled:
    """Allocate a pool with room for `steps` more tokens each and prefill `prompts` into it."""
    blocks_each = -(-(max(map(len, prompts)) + steps) // BLOCK_SIZE)
    model.allocate_cache(blocks_each * len(prompts), BLOCK_SIZE)
    tables = [list(range(i * blocks_each, (i + 1) * blocks_each)) for i in range(len(prompts))]
    chunks = [SeqChunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)]
    first_tokens = model.forward(StepInput(chunks)).argmax(-1).tolist()
    return Prefilled(prompts, tables, first_tokens)


def decode_tokens_per_s(model: LlamaModel, state: Prefilled, size: int, steps: int) -> float:
    """Greedy-decode `steps` tokens for the first `size` prefilled prompts; tokens per second."""
    rows = list(zip(state.prompts, state.tables, strict=True))[:size]
    nexts = state.first_tokens[:size]
    started = time.perf_counter()
    for step in range(steps):
        chunks = [
            SeqChunk([token], len(p) + step, t) for (p, t), token in zip(rows, nexts, strict=True)
        ]
        nexts = model.forward(StepInput(chunks)).argmax(-1).tolist()
    return size * steps / (time.perf_counter() - started)


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
    states = {name: prefill(model, batch, args.steps) for name, model in models.items()}
    samples: dict[tuple[str, int], list[float]] = {}
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for size in BATCHES:
            for name, model in models.items():
                rate = decode_tokens_per_s(model, states[name], size, args.steps)
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
