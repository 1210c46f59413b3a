"""``make bench-semantic-cache``: the semantic cache on a paraphrase workload, side by side.

Two runs of SmolLM2-135M in one benchmark, each a fresh server pinned to the server core
with one torch thread, driven from the client core by one client (closed loop, one request
at a time) with the same seeded workload of greedy chat requests (``temperature: 0``,
``max_tokens`` small):

(a) the semantic cache off: every request generated; these are the model's own greedy
    answers, the reference for (b);
(b) the semantic cache on (MiniLM on ONNX Runtime as the encoder, ``min_similarity`` as
    given).

The workload (``GROUPS``, ``NEAR_MISSES``): hand-written questions, each with paraphrases
that ask the same, sent in a seeded order that repeats each question once more word for
word; and *near misses*, questions worded like a cached one that ask something else (the
capital of Germany after the capital of France), which a semantic cache must not answer
from the other's entry. Each request of (b) is classified from the server's own
``fleetserve_semantic_cache_requests_total`` (read between requests, outside the timings).

Figures: the exact and semantic hit ratios (of all requests); the false-hit rate, the
semantic hits whose answer differs from the model's own answer to that prompt in (a), of
all semantic hits; the exact hits that differ (0 unless generation is not deterministic);
the near misses answered from the cache (a wrong question's answer, the harmful kind of false
hit); requests per second with and without the cache. The JSON lists every semantic hit
with the answer served and the model's own, to judge how they differ. The last line is the speedup,
``semantic_cache_speedup=`` (b over a). A small ``max_tokens`` keeps a run within minutes on
two CPU cores; longer answers raise the speedup, as a hit costs the same at any length.

Usage: ``.venv/bin/python -m bench.semantic_cache_bench [--max-tokens N] [--repeats N] ...``
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import httpx
from rich.console import Console
from rich.table import Table

from bench.pinning import pin_current_process
from bench.report import RunClock
from bench.server_proc import running_server, runtime_serve_argv
from fleetserve_runtime.testing import metric_total
from fleetserve_runtime.testing.process import free_port

MODEL_NAME = "smollm2"
ENCODER = "builtin://minilm-l6"
METRIC = "fleetserve_semantic_cache_requests_total"
Outcome = Literal["exact_hit", "semantic_hit", "miss", "bypass", "off"]
OUTCOMES: tuple[Outcome, ...] = ("exact_hit", "semantic_hit", "miss", "bypass")

GROUPS: tuple[tuple[str, ...], ...] = (
    (
        "What is the capital of France?",
        "What is France's capital?",
        "What is the capital city of France?",
    ),
    (
        "How many legs does a spider have?",
        "How many legs do spiders have?",
        "What is the number of legs on a spider?",
    ),
    (
        "What is the boiling point of water?",
        "What's the boiling point of water?",
        "At what temperature does water boil?",
    ),
    (
        "Who wrote Romeo and Juliet?",
        "Who is the author of Romeo and Juliet?",
        "Romeo and Juliet was written by whom?",
    ),
    (
        "What is the largest planet in the solar system?",
        "What's the biggest planet in the solar system?",
        "Which planet is the largest in our solar system?",
    ),
    (
        "What colour is the sky on a clear day?",
        "What color is the sky on a clear day?",
        "On a clear day, what colour is the sky?",
    ),
    (
        "Give me a synonym for happy.",
        "What is a synonym for happy?",
        "Give me another word for happy.",
    ),
    (
        "How do you say 'thank you' in Spanish?",
        "What is 'thank you' in Spanish?",
        "Translate 'thank you' into Spanish.",
    ),
)
"""Each group asks one thing: its first wording, then paraphrases written by hand."""
NEAR_MISSES: tuple[str, ...] = (
    "What is the capital of Germany?",
    "How many legs does an ant have?",
    "What is the freezing point of water?",
    "Who wrote Hamlet?",
    "What is the smallest planet in the solar system?",
    "Translate 'thank you' into French.",
    "Give me a synonym for sad.",
    "What colour is grass?",
)
"""Worded like a group's question, asking something else: a hit on one is a false hit."""

Kind = Literal["first", "repeat", "paraphrase", "near_miss"]


@dataclass(frozen=True)
class WorkItem:
    """One request of the workload: its prompt and why it is there."""

    prompt: str
    kind: Kind


def build_workload(*, groups: int, repeats: int, seed: int) -> tuple[WorkItem, ...]:
    """Each group's first wording, `repeats` exact repeats, its paraphrases, the near misses.

    Seeded order, except that a group's first wording comes before the rest of its group,
    so a repeat can only hit what was asked before it.
    """
    rng = random.Random(seed)
    chosen = GROUPS[:groups]
    firsts = [WorkItem(group[0], "first") for group in chosen]
    rest = [WorkItem(group[0], "repeat") for group in chosen for _ in range(repeats)]
    rest += [WorkItem(text, "paraphrase") for group in chosen for text in group[1:]]
    rest += [WorkItem(text, "near_miss") for text in NEAR_MISSES[:groups]]
    rng.shuffle(firsts)
    rng.shuffle(rest)
    return (*firsts, *rest)


@dataclass
class RunResult:
    """One configuration's answers, outcomes and time."""

    label: str
    answers: list[str] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    """Sum of the requests' latencies (the metric reads between them excluded)."""

    @property
    def requests_per_s(self) -> float:
        """Requests answered per second of request time."""
        return len(self.answers) / self.seconds if self.seconds else 0.0


def _outcome_counts(client: httpx.Client) -> dict[Outcome, float]:
    text = client.get("/metrics").text
    return {outcome: metric_total(text, METRIC, outcome=outcome) for outcome in OUTCOMES}


def run_workload(
    client: httpx.Client, items: Sequence[WorkItem], *, label: str, cached: bool, max_tokens: int
) -> RunResult:
    """Send `items` one at a time; with `cached`, classify each from the metric's change."""
    result = RunResult(label)
    before = _outcome_counts(client) if cached else {}
    for item in items:
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": item.prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        started = time.perf_counter()
        response = client.post("/v1/chat/completions", json=body)
        result.seconds += time.perf_counter() - started
        response.raise_for_status()
        result.answers.append(response.json()["choices"][0]["message"]["content"])
        if cached:
            after = _outcome_counts(client)
            changed = [o for o in OUTCOMES if after[o] > before[o]]
            result.outcomes.append(changed[0] if len(changed) == 1 else "off")
            before = after
        else:
            result.outcomes.append("off")
    return result


@dataclass(frozen=True)
class Summary:
    """The figures the report prints."""

    requests: int
    exact_hit_ratio: float
    semantic_hit_ratio: float
    false_hit_rate: float
    false_hits: int
    near_miss_hit_rate: float
    """Near misses answered from the cache (another question's answer), of all near misses."""
    exact_hit_mismatches: int
    hits_by_kind: dict[str, int]
    requests_per_s_off: float
    requests_per_s_on: float
    speedup: float
    semantic_hits: list[dict[str, str]]
    """Each semantic hit: the prompt, the cached answer served, the model's own answer."""


def summarise(items: Sequence[WorkItem], off: RunResult, on: RunResult) -> Summary:
    """Hit ratios, false hits against `off`'s answers, throughputs and the speedup."""
    count = len(items)
    exact = [i for i, o in enumerate(on.outcomes) if o == "exact_hit"]
    semantic = [i for i, o in enumerate(on.outcomes) if o == "semantic_hit"]
    false_hits = sum(on.answers[i] != off.answers[i] for i in semantic)
    near_misses = [i for i, item in enumerate(items) if item.kind == "near_miss"]
    near_miss_hits = sum(on.outcomes[i] in ("exact_hit", "semantic_hit") for i in near_misses)
    hits_by_kind: dict[str, int] = {}
    for item, outcome in zip(items, on.outcomes, strict=True):
        if outcome in ("exact_hit", "semantic_hit"):
            key = f"{item.kind}:{outcome}"
            hits_by_kind[key] = hits_by_kind.get(key, 0) + 1
    return Summary(
        requests=count,
        exact_hit_ratio=len(exact) / count,
        semantic_hit_ratio=len(semantic) / count,
        false_hit_rate=false_hits / len(semantic) if semantic else 0.0,
        false_hits=false_hits,
        near_miss_hit_rate=near_miss_hits / len(near_misses) if near_misses else 0.0,
        exact_hit_mismatches=sum(on.answers[i] != off.answers[i] for i in exact),
        hits_by_kind=hits_by_kind,
        requests_per_s_off=off.requests_per_s,
        requests_per_s_on=on.requests_per_s,
        speedup=on.requests_per_s / off.requests_per_s if off.requests_per_s else 0.0,
        semantic_hits=[
            {"prompt": items[i].prompt, "served": on.answers[i], "model": off.answers[i]}
            for i in semantic
        ],
    )


def measure(
    items: Sequence[WorkItem], *, cached: bool, args: argparse.Namespace, log_dir: Path
) -> RunResult:
    """Start a server (cache off or on), run the workload once, stop it."""
    port = free_port()
    argv = runtime_serve_argv(
        args.runtime.split(), model=args.model, name=MODEL_NAME, port=port
    ) + [f"--generation-max-context={args.max_context}"]
    if cached:
        argv += [
            f"--semantic-cache-encoder={ENCODER}",
            f"--semantic-cache-max-entries={args.max_entries}",
            f"--semantic-cache-min-similarity={args.min_similarity}",
        ]
    label = "on" if cached else "off"
    base_url = f"http://127.0.0.1:{port}"
    with (
        running_server(
            argv, base_url=base_url, core=args.server_core, log_path=log_dir / f"{label}.log"
        ),
        httpx.Client(base_url=base_url, timeout=args.request_timeout_s) as client,
    ):
        return run_workload(client, items, label=label, cached=cached, max_tokens=args.max_tokens)


def _table(summary: Summary) -> Table:
    table = Table(title="semantic cache: paraphrase workload, greedy chat, one client")
    for column in ("figure", "value"):
        table.add_column(column)
    rows = {
        "requests": f"{summary.requests}",
        "exact hit ratio": f"{summary.exact_hit_ratio:.3f}",
        "semantic hit ratio": f"{summary.semantic_hit_ratio:.3f}",
        "false-hit rate (of semantic hits)": f"{summary.false_hit_rate:.3f}",
        "near misses answered from the cache": f"{summary.near_miss_hit_rate:.3f}",
        "exact hits unlike the model's answer": f"{summary.exact_hit_mismatches}",
        "requests/s, cache off": f"{summary.requests_per_s_off:.2f}",
        "requests/s, cache on": f"{summary.requests_per_s_on:.2f}",
    }
    for name, value in rows.items():
        table.add_row(name, value)
    return table


def print_report(summary: Summary, *, context: dict[str, object]) -> None:
    """The table, the JSON of everything, and the key=value lines, the speedup last."""
    Console(width=110).print(_table(summary))
    print(json.dumps({"context": context, "summary": asdict(summary)}, indent=2, default=str))
    print(f"semantic_cache_exact_hit_ratio={summary.exact_hit_ratio:.3f}")
    print(f"semantic_cache_semantic_hit_ratio={summary.semantic_hit_ratio:.3f}")
    print(f"semantic_cache_false_hit_rate={summary.false_hit_rate:.3f}")
    print(f"semantic_cache_near_miss_hit_rate={summary.near_miss_hit_rate:.3f}")
    print(f"semantic_cache_speedup={summary.speedup:.2f}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--runtime", default=str(Path(sys.executable).with_name("fleetserve-runtime"))
    )
    parser.add_argument("--model", default="builtin://smollm2-135m")
    parser.add_argument("--groups", type=int, default=len(GROUPS), help="question groups")
    parser.add_argument("--repeats", type=int, default=1, help="exact repeats per question")
    parser.add_argument("--max-tokens", type=int, default=24, help="per answer")
    parser.add_argument("--max-context", type=int, default=512)
    parser.add_argument("--min-similarity", type=float, default=0.95)
    parser.add_argument("--max-entries", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--request-timeout-s", type=float, default=300.0)
    return parser.parse_args(argv)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM (``timeout``, a CI runner) into SystemExit, so the server is stopped."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the workload with the cache off, then on, and print the report."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    clock = RunClock()
    items = build_workload(groups=args.groups, repeats=args.repeats, seed=args.seed)
    pin_current_process(args.client_core)
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-semantic-") as log_dir:
        off = measure(items, cached=False, args=args, log_dir=Path(log_dir))
        on = measure(items, cached=True, args=args, log_dir=Path(log_dir))
    print_report(summarise(items, off, on), context=clock.context(args))


if __name__ == "__main__":
    main()
