"""``make bench-runtime`` (second part): serving precision measured side by side in one run.

The same seeded closed-loop workload as ``bench.runtime_bench`` (its request set, server
start and load generator), against MiniLM served four ways, each in a fresh process pinned
to the server core, with dynamic batching (length buckets, max batch 32):

fp32      the torch encoder in fp32 (``--backend torch``, the baseline);
int8      the torch encoder with int8 Linear layers (``--precision int8``);
ort       MiniLM exported to ONNX (``models.onnx_export``) run by ONNX Runtime in fp32, the
          engine ``--backend auto`` picks for MiniLM in fp32 on a CPU;
ort-int8  the same graph quantised at load (``--precision int8``).

Every int8 server passes the accuracy guard before it serves. The last two lines are
``int8_speedup=`` (the faster int8 configuration's requests/s over fp32 torch's) and
``int8_min_cosine=`` (that configuration's guard figure, recomputed in process the way the
server computes it at load).

Usage: ``.venv/bin/python -m bench.precision_bench [--requests N] [--configs fp32,int8] ...``
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from bench.report import ConfigResult, RunClock
from bench.runtime_bench import BATCHED, TORCH, ServerConfig, measure_summary, prepare_client
from bench.server_proc import add_closed_loop_options
from fleetserve_runtime.models.accuracy import PrecisionOptions
from fleetserve_runtime.models.onnx_export import export_minilm
from fleetserve_runtime.models.registry import resolve_handler

LABELS = ("fp32", "int8", "ort", "ort-int8")
INT8_LABELS = ("int8", "ort-int8")


def server_configs(onnx_uri: str, *, floor: float) -> dict[str, ServerConfig]:
    """Every configuration by label; a later ``--model`` overrides the bench's default."""
    # The speed guard is off: this benchmark measures int8's speed, on any CPU.
    guard = (f"--precision-min-cosine={floor}", "--precision-min-speedup=0")
    onnx = (f"--model={onnx_uri}",)
    int8 = ("--precision=int8", *guard)
    return {
        "fp32": ServerConfig("fp32", "torch fp32", (*BATCHED, *TORCH)),
        "int8": ServerConfig("int8", "torch int8 (per-token, smoothed)", (*BATCHED, *TORCH, *int8)),
        "ort": ServerConfig("ort", "ONNX Runtime fp32", (*BATCHED, *onnx)),
        "ort-int8": ServerConfig("ort-int8", "ONNX Runtime int8", (*BATCHED, *onnx, *int8)),
    }


def model_uri(config: ServerConfig, default: str) -> str:
    """The model URI a configuration serves: its own ``--model``, else the bench's."""
    uris = [arg.removeprefix("--model=") for arg in config.args if arg.startswith("--model=")]
    return uris[-1] if uris else default


def best_int8(results: Sequence[ConfigResult]) -> ConfigResult | None:
    """The int8 configuration with the highest throughput, if any ran."""
    int8 = [r for r in results if r.label in INT8_LABELS]
    return max(int8, key=lambda r: r.throughput_rps, default=None)


def int8_speedup(results: Sequence[ConfigResult]) -> float:
    """Best int8 requests/s over fp32 torch's; 0 when either is missing or fp32 served none."""
    best = best_int8(results)
    fp32 = next((r for r in results if r.label == "fp32"), None)
    if best is None or fp32 is None or not fp32.throughput_rps:
        return 0.0
    return best.throughput_rps / fp32.throughput_rps


def guard_figure(uri: str, *, floor: float) -> float:
    """The accuracy guard's min cosine of ``uri`` in int8, computed as the server does."""
    handler = resolve_handler(
        uri,
        name="bench",
        version="v1",
        max_sequence_length=256,
        precision=PrecisionOptions("int8", floor, min_speedup=0.0),
    )
    handler.load(torch.device("cpu"))
    figure = handler.metadata.min_cosine
    if figure is None:
        msg = f"{uri} loaded in int8 without a guard figure"
        raise RuntimeError(msg)
    return figure


def _table(results: Sequence[ConfigResult]) -> Table:
    table = Table(title="MiniLM by serving precision (closed loop, one server core)")
    for column in ("config", "what", "req/s", "p50 ms", "p99 ms", "batch", "cpu ms/req", "ok"):
        table.add_column(column)
    for r in results:
        table.add_row(
            r.label,
            r.description,
            f"{r.throughput_rps:.1f}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.mean_batch_size:.1f}",
            f"{r.server_cpu_ms_per_request:.2f}",
            f"{r.succeeded}/{r.sent}",
        )
    return table


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (the load options are the runtime bench's)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_closed_loop_options(parser)
    parser.add_argument("--profile", default="mixed")
    parser.add_argument("--min-cosine", type=float, default=0.99, help="accuracy guard floor")
    parser.add_argument(
        "--configs", default=",".join(LABELS), help=f"comma-separated subset of {LABELS}"
    )
    args = parser.parse_args(argv)
    unknown = set(args.configs.split(",")) - set(LABELS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}; known are {LABELS}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the chosen configurations and print the table, the JSON and the two lines."""
    args = parse_args(argv)
    clock = RunClock()
    requests, peak_flops = prepare_client(args)
    results: list[ConfigResult] = []
    with tempfile.TemporaryDirectory(prefix="fleetserve-precision-") as work:
        labels = args.configs.split(",")
        onnx_uri = ""
        if any(label.startswith("ort") for label in labels):
            onnx_uri = f"file://{export_minilm(Path(work) / 'onnx')}"
        configs = server_configs(onnx_uri, floor=args.min_cosine)
        for label in labels:
            results.append(
                measure_summary(
                    configs[label], requests, args=args, log_dir=Path(work), peak_flops=peak_flops
                )
            )
        best = best_int8(results)
        figure = (
            guard_figure(model_uri(configs[best.label], args.model), floor=args.min_cosine)
            if best is not None
            else float("nan")
        )
    context = clock.context(
        args,
        torch=version("torch"),
        onnxruntime=version("onnxruntime"),
        best_int8=best.label if best is not None else None,
    )
    Console(width=120).print(_table(results))
    document = {"context": context, "results": [asdict(r) for r in results]}
    print(json.dumps(document, indent=2, default=str))
    print(f"int8_speedup={int8_speedup(results):.2f}")
    print(f"int8_min_cosine={figure:.4f}")


if __name__ == "__main__":
    main()
