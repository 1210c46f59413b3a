"""``make bench-peers``: the runtime beside the servers a user would pick instead, same MiniLM.

Serves all-MiniLM-L6-v2 (the same safetensors and tokenizer) with the runtime — as it runs
by default (ONNX Runtime on the CPU) and on the torch backend the peers use — and with each
peer in ``bench/peers/`` — LitServe, Ray Serve, MLServer, BentoML, PyTriton and plain FastAPI —
one at a time, each in a fresh process group pinned to the server core, each peer in its own
virtualenv built from its hash-pinned requirements. Every server must first embed a fixed text
set with cosine > 0.99 to the runtime's embeddings; a server that does not is reported failed
and not timed. Then the same closed-loop load as ``make bench-runtime`` (``bench.loadgen``,
64 clients on the client core) runs once per length profile.

The last three lines are ``vs_best_peer_torch=`` (the torch row over the best peer),
``best_peer=<name>`` and ``vs_best_peer=<ours / best peer's req/s>`` for the first profile
(``mixed`` by default).

Usage: ``.venv/bin/python -m bench.peers_bench [--peers a,b] [--profile mixed,short] [--quick]``
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.loadgen import LoadResult, run_closed_loop
from bench.pinning import pin_current_process
from bench.report import RunClock
from bench.runtime_bench import BATCHED, MODEL_NAME, TORCH, server_argv
from bench.runtime_bench import request_body as oip_request_body
from bench.server_metrics import scrape
from bench.server_proc import add_closed_loop_options, running_server
from bench.textgen import PROFILES, generate_workload
from fleetserve_runtime.testing.process import free_ports

REPO_ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = REPO_ROOT / "bench" / "peers"

#: Embeddings below this cosine to the runtime's mean a broken peer, not a slow one.
MIN_COSINE = 0.99

#: Written last into a peer's virtualenv; without it the directory is a failed build.
COMPLETE_MARKER = ".fleetserve-complete"

#: The line ``bench.peers.encoder`` prints per forward pass.
BATCH_LINE = re.compile(rb"batch_size=(\d+)")

#: Time for log lines forwarded by a peer's own log machinery (Ray's) to reach the log file.
LOG_SETTLE_S = 2.0

#: Texts every server must embed like the runtime does, from one word to the model's limit.
CHECK_TEXTS = (
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "what is the boiling point of water at high altitude",
    "Serving many short requests well depends on how they are batched together.",
    "A man is playing a guitar on a stage while the audience sings along loudly.",
    " ".join(["kubernetes operators reconcile desired state with observed state"] * 12),
)


def text_body(text: str) -> bytes:
    """``{"text": ...}``, the single-text JSON the framework tutorials accept."""
    return json.dumps({"text": text}).encode("utf-8")


def texts_body(text: str) -> bytes:
    """``{"texts": [...]}``: a batchable BentoML API takes a list and batches along it."""
    return json.dumps({"texts": [text]}).encode("utf-8")


def triton_body(text: str) -> bytes:
    """Open Inference Protocol with the batch dimension Triton models declare: shape [1, 1]."""
    payload = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
    return json.dumps(payload).encode("utf-8")


def embedding_field(answer: Any) -> list[float]:
    """The vector of ``{"embedding": [...]}``."""
    vector: list[float] = answer["embedding"]
    return vector


def first_row(answer: Any) -> list[float]:
    """The only row of a ``[[...]]`` answer."""
    vector: list[float] = answer[0]
    return vector


def oip_output(answer: Any) -> list[float]:
    """The first output's flat data of an Open Inference Protocol answer."""
    vector: list[float] = answer["outputs"][0]["data"]
    return vector


@dataclass(frozen=True)
class Server:
    """One server under test and how to talk to it.

    Attributes:
        name: Name on the command line and in the table.
        package: Distribution whose version the table shows.
        batching: How it batches, as configured here.
        ready_path: Path that answers ``GET`` with 200 once it serves.
        infer_path: Path the load generator posts to.
        body: One text to its serialised request.
        embedding: Its decoded JSON answer to the text's embedding.
        venv: True when it runs in its own virtualenv built from ``bench/peers/<name>``.
        runtime_args: For the runtime itself, the options its configuration adds; None for
            a peer.
        engine: The distribution that runs the model's forward pass.
        side_ports: Listeners it opens besides HTTP (gRPC, metrics): the bench picks their
            ports with the HTTP one, all held until each is picked, and passes them as
            ``--side-ports``; a server picking its own might get the HTTP port back, which
            is free until the server binds it.
    """

    name: str
    package: str
    batching: str
    ready_path: str
    infer_path: str
    body: Callable[[str], bytes]
    embedding: Callable[[Any], list[float]]
    venv: bool = True
    runtime_args: tuple[str, ...] | None = None
    engine: str = "torch"
    side_ports: int = 0


OURS = Server(
    "fleetserve",
    "fleetserve-runtime",
    "length buckets, max 32, 10 ms (default backend: ONNX Runtime on CPU)",
    "/v2/health/ready",
    f"/v2/models/{MODEL_NAME}/infer",
    oip_request_body,
    oip_output,
    venv=False,
    runtime_args=BATCHED,
    engine="onnxruntime",
)
OURS_TORCH = Server(
    "fleetserve-torch",
    "fleetserve-runtime",
    "length buckets + packing, max 32, 10 ms (torch backend)",
    OURS.ready_path,
    OURS.infer_path,
    oip_request_body,
    oip_output,
    venv=False,
    runtime_args=(*BATCHED, *TORCH),
)
"""The runtime on the peers' own engine, torch eager: its lead is the batching design alone."""
OUR_NAMES = (OURS.name, OURS_TORCH.name)

PEERS = {
    peer.name: peer
    for peer in (
        Server(
            "litserve",
            "litserve",
            "max_batch_size=32, batch_timeout=0.01",
            "/health",
            "/predict",
            text_body,
            embedding_field,
        ),
        Server(
            "rayserve",
            "ray",
            "@serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)",
            "/-/healthz",
            "/embed",
            text_body,
            embedding_field,
        ),
        Server(
            "mlserver",
            "mlserver",
            "adaptive batching, max_batch_size=32, max_batch_time=0.01",
            "/v2/health/ready",
            f"/v2/models/{MODEL_NAME}/infer",
            oip_request_body,
            oip_output,
            side_ports=2,
        ),
        Server(
            "bentoml",
            "bentoml",
            "@bentoml.api(batchable=True, max_batch_size=32), adaptive delay",
            "/readyz",
            "/embed",
            texts_body,
            first_row,
        ),
        Server(
            "pytriton",
            "nvidia-pytriton",
            "DynamicBatcher(max_queue_delay_microseconds=10000), max_batch_size=32",
            # Triton's server readiness comes before PyTriton has loaded the model.
            f"/v2/models/{MODEL_NAME}/ready",
            f"/v2/models/{MODEL_NAME}/infer",
            triton_body,
            oip_output,
            side_ports=2,
        ),
        Server(
            "fastapi",
            "fastapi",
            "none (one text per forward pass)",
            "/health",
            "/embed",
            text_body,
            embedding_field,
            venv=False,
        ),
    )
}


class PeerUnavailable(RuntimeError):
    """A peer could not be installed, started or checked; the message says why."""


def venv_dir(cache_root: Path, name: str, requirements: Path) -> Path:
    """Return the peer's virtualenv directory, named by a hash of its pinned requirements.

    A new pin set gets a new directory, so a stale environment is never reused.
    """
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    return cache_root / f"{name}-{digest}"


def _run_logged(argv: Sequence[str]) -> None:
    """Run ``argv``; on failure raise ``PeerUnavailable`` with the command and its output."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise PeerUnavailable(f"`{shlex.join(argv)}` exited {done.returncode}:\n{tail}")


def ensure_venv(name: str, cache_root: Path) -> Path:
    """Build the peer's virtualenv on first use; return its Python.

    The closure is installed with ``--require-hashes --no-deps`` from the peer's
    ``requirements.txt``, so nothing unpinned enters. The venv is built in place (its scripts
    hold absolute paths) and marked complete last; an unmarked directory is rebuilt.
    """
    requirements = PEERS_DIR / name / "requirements.txt"
    target = venv_dir(cache_root, name, requirements)
    python = target / "bin" / "python"
    if (target / COMPLETE_MARKER).exists():
        return python
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    _run_logged([sys.executable, "-m", "venv", str(target)])
    _run_logged(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--require-hashes",
            "--no-deps",
            "-r",
            str(requirements),
        ]
    )
    share_identical_files(cache_root)
    (target / COMPLETE_MARKER).write_text(requirements.read_text())
    return python


def share_identical_files(cache_root: Path) -> None:
    """Hard-link the files the peers' virtualenvs have in common.

    Every peer pins the runtime's torch, so each venv holds the same ~5 GB of torch and CUDA
    libraries; linking them keeps five venvs near the size of one. Only a disk-space saving:
    without util-linux's ``hardlink`` the venvs simply stay separate copies.
    """
    tool = shutil.which("hardlink")
    if tool is not None:
        subprocess.run(
            [tool, "--quiet", "--content", "--respect-name", "--minimum-size=1M", str(cache_root)],
            check=False,
        )


def installed_versions(python: Path, packages: Sequence[str]) -> dict[str, str]:
    """Return the versions of ``packages`` as the interpreter ``python`` sees them."""
    script = (
        "import importlib.metadata as m, json, sys;"
        "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    )
    done = subprocess.run(
        [str(python), "-c", script, *packages], capture_output=True, text=True, check=True
    )
    found: dict[str, str] = json.loads(done.stdout)
    return found


def server_command(
    server: Server, python: Path, ports: Sequence[int], args: argparse.Namespace
) -> list[str]:
    """Return the command line that starts ``server`` on 127.0.0.1:``ports[0]``.

    The rest of ``ports`` are its ``side_ports``.
    """
    port, *side_ports = ports
    if server.runtime_args is not None:
        return [*server_argv(shlex.split(args.runtime), port=port, args=args), *server.runtime_args]
    # `env` puts the repository on the path: the peer imports bench.peers.* from the tree.
    return [
        "env",
        f"PYTHONPATH={REPO_ROOT}",
        str(python),
        "-m",
        f"bench.peers.{server.name}.server",
        f"--port={port}",
        *(["--side-ports", *map(str, side_ports)] if side_ports else []),
    ]


def min_cosine(reference: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]]) -> float:
    """Return the smallest cosine between matching rows; -1 when the shapes differ."""
    ref = np.asarray(reference, dtype=np.float64)
    got = np.asarray(candidate, dtype=np.float64)
    if ref.shape != got.shape:
        return -1.0
    dots = np.sum(ref * got, axis=1)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1)
    return float(np.min(dots / np.maximum(norms, 1e-12)))


def post_json(url: str, body: bytes, *, timeout_s: float) -> Any:
    """POST ``body``; retry while the server is not routing yet; return the decoded answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        request = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30.0) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            if time.monotonic() > deadline:
                raise PeerUnavailable(f"POST {url} kept failing: {error}") from error
            time.sleep(0.5)


def embed_check_texts(server: Server, url: str) -> list[list[float]]:
    """Embed ``CHECK_TEXTS`` one request each, as the load generator will send them."""
    return [
        server.embedding(post_json(url, server.body(text), timeout_s=60.0)) for text in CHECK_TEXTS
    ]


def _proc_stats() -> dict[int, tuple[int, int]]:
    """Every live process: pid to (parent pid, CPU clock ticks used, user + system)."""
    stats: dict[int, tuple[int, int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # proc(5): ppid is field 4, utime and stime fields 14 and 15; fields[0] is field 3.
        stats[int(stat.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return stats


def tree_cpu_seconds(root: int) -> float:
    """Return the CPU time used so far by process ``root`` and all its live descendants.

    A peer's work spreads over processes (Ray's raylet and replica, BentoML's workers,
    Triton, LitServe's inference worker), some of which leave the server's process group,
    so the process tree is counted. On a shared machine, CPU per request stays comparable
    between servers where req/s does not.
    """
    stats = _proc_stats()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total += stats.get(pid, (0, 0))[1]
        pending.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def batch_sizes(log: bytes) -> list[int]:
    """Return the batch sizes the peer's encoder logged, in order."""
    return [int(size) for size in BATCH_LINE.findall(log)]


def mean_or_none(values: Sequence[int]) -> float | None:
    """Return the mean, or None for no values."""
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Row:
    """One server's figures under one profile, or why it has none.

    Attributes:
        server: Server name.
        version: Its package version (and torch's).
        batching: How it batches.
        profile: Length profile of the load.
        ok: False when it could not be installed, started, or failed the embedding check.
        reason: Why it failed; empty when ``ok``.
        min_cosine: Smallest cosine of its check embeddings to the runtime's.
        throughput_rps: Successful requests per second.
        p50_ms: Median latency of successful requests.
        p99_ms: 99th-percentile latency of successful requests.
        mean_batch: Texts per forward pass in the measured window; None when not exposed.
        cpu_ms_per_request: CPU milliseconds the server's process tree spent per successful
            request in the window; comparable across servers even on a busy machine.
        errors: Requests without a 2xx answer.
        sent: Requests sent.
        timed_out: True when the time limit cut the run short.
    """

    server: str
    version: str
    batching: str
    profile: str
    ok: bool
    reason: str = ""
    min_cosine: float = math.nan
    throughput_rps: float = 0.0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    mean_batch: float | None = None
    cpu_ms_per_request: float = math.nan
    errors: int = 0
    sent: int = 0
    timed_out: bool = False


@dataclass(frozen=True)
class Workloads:
    """Per profile, the serialised warm-up and measured texts every server gets."""

    texts: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


def build_workloads(args: argparse.Namespace) -> Workloads:
    """Generate each profile's seeded texts once (bench-runtime's generator and seed)."""
    texts: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for profile in args.profiles:
        workload = generate_workload(
            PROFILES[profile], args.warmup + args.requests, seed=args.seed
        ).texts
        texts[profile] = (workload[: args.warmup], workload[args.warmup :])
    return Workloads(texts)


@dataclass(frozen=True)
class Window:
    """What the measured window gives besides the client's view."""

    load: LoadResult
    mean_batch: float | None
    cpu_s: float


def measure_window(
    server: Server,
    base_url: str,
    bodies: Sequence[bytes],
    *,
    pid: int,
    log_path: Path,
    args: argparse.Namespace,
) -> Window:
    """Run the closed loop; read the batch sizes from the runtime's metrics or the peer's log."""
    url = f"{base_url}{server.infer_path}"
    counters_before = scrape(base_url) if server.runtime_args is not None else None
    log_offset = log_path.stat().st_size
    cpu_before = tree_cpu_seconds(pid)
    load = asyncio.run(
        run_closed_loop(url, bodies, concurrency=args.concurrency, time_limit_s=args.time_limit_s)
    )
    cpu_s = tree_cpu_seconds(pid) - cpu_before
    if counters_before is not None:
        return Window(load, (scrape(base_url) - counters_before).mean_batch_size, cpu_s)
    time.sleep(LOG_SETTLE_S)
    with log_path.open("rb") as log:
        log.seek(log_offset)
        return Window(load, mean_or_none(batch_sizes(log.read())), cpu_s)


def run_server(
    server: Server,
    *,
    python: Path,
    reference: list[list[float]] | None,
    workloads: Workloads,
    args: argparse.Namespace,
    log_dir: Path,
) -> tuple[list[Row], list[list[float]]]:
    """Start ``server``, check its embeddings, then measure every profile; return rows, vectors."""
    label = version_label(server, python)
    ports = free_ports(1 + server.side_ports)
    base_url = f"http://127.0.0.1:{ports[0]}"
    log_path = log_dir / f"{server.name}.log"
    rows: list[Row] = []
    with running_server(
        server_command(server, python, ports, args),
        base_url=base_url,
        core=args.server_core,
        log_path=log_path,
        ready_timeout_s=args.ready_timeout_s,
        ready_path=server.ready_path,
    ) as pid:
        vectors = embed_check_texts(server, f"{base_url}{server.infer_path}")
        cosine = min_cosine(reference if reference is not None else vectors, vectors)
        if cosine <= MIN_COSINE:
            reason = f"embeddings differ from the runtime's: min cosine {cosine:.4f}"
            failed = [
                Row(server.name, label, server.batching, p, False, reason, cosine)
                for p in args.profiles
            ]
            return failed, vectors
        for profile in args.profiles:
            warmup, measured = workloads.texts[profile]
            asyncio.run(
                run_closed_loop(
                    f"{base_url}{server.infer_path}",
                    [server.body(t) for t in warmup],
                    concurrency=args.concurrency,
                )
            )
            bodies = [server.body(t) for t in measured]
            window = measure_window(server, base_url, bodies, pid=pid, log_path=log_path, args=args)
            rows.append(_row(server, label, profile, cosine, window))
    return rows, vectors


def _row(server: Server, label: str, profile: str, cosine: float, window: Window) -> Row:
    """Turn a measured window into the table's row."""
    load = window.load
    sent = sum(load.status_counts.values())
    return Row(
        server=server.name,
        version=label,
        batching=server.batching,
        profile=profile,
        ok=True,
        min_cosine=cosine,
        throughput_rps=load.throughput_rps,
        p50_ms=load.latency_ms(0.50),
        p99_ms=load.latency_ms(0.99),
        mean_batch=window.mean_batch,
        cpu_ms_per_request=1000.0 * window.cpu_s / max(load.succeeded, 1),
        errors=sent - load.succeeded,
        sent=sent,
        timed_out=load.timed_out,
    )


def version_label(server: Server, python: Path) -> str:
    """Return e.g. ``2.1.0 (torch 2.15.0)``: the server's package and the engine it runs on."""
    if server.venv:
        found = installed_versions(python, [server.package, server.engine])
        return f"{found[server.package]} ({server.engine} {found[server.engine]})"
    return f"{version(server.package)} ({server.engine} {version(server.engine)})"


def failed_rows(server: Server, reason: str, profiles: Sequence[str]) -> list[Row]:
    """Rows saying why ``server`` has no figures."""
    return [
        Row(server.name, "", server.batching, profile, ok=False, reason=reason)
        for profile in profiles
    ]


def measure_all(args: argparse.Namespace, log_dir: Path) -> list[Row]:
    """Run the runtime, then each selected peer; a peer's failure is recorded, not raised."""
    workloads = build_workloads(args)
    own_python = Path(sys.executable)

    def run(
        server: Server, python: Path, reference: list[list[float]] | None
    ) -> tuple[list[Row], list[list[float]]]:
        return run_server(
            server,
            python=python,
            reference=reference,
            workloads=workloads,
            args=args,
            log_dir=log_dir,
        )

    rows, reference = run(OURS, own_python, None)
    torch_rows, _ = run(OURS_TORCH, own_python, reference)
    rows.extend(torch_rows)
    for name in args.peers:
        peer = PEERS[name]
        try:
            python = ensure_venv(name, args.cache_dir) if peer.venv else own_python
            peer_rows, _ = run(peer, python, reference)
        except (PeerUnavailable, RuntimeError, subprocess.CalledProcessError) as error:
            peer_rows = failed_rows(
                peer, f"{error}{log_tail(log_dir / f'{name}.log')}", args.profiles
            )
        rows.extend(peer_rows)
    return rows


def log_tail(log_path: Path, lines: int = 20) -> str:
    """The end of a server's log, to explain its failure; empty if it never started."""
    if not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return "\n--- server log (last lines) ---\n" + "\n".join(tail)


def best_peer(rows: Sequence[Row], profile: str) -> Row | None:
    """Return the peer with the highest req/s under ``profile`` among those that passed."""
    candidates = [r for r in rows if r.profile == profile and r.ok and r.server not in OUR_NAMES]
    return max(candidates, key=lambda r: r.throughput_rps, default=None)


def closing_lines(rows: Sequence[Row], profile: str, *, suffix: str = "") -> list[str]:
    """``vs_best_peer_torch<suffix>=``, ``best_peer<suffix>=`` and ``vs_best_peer<suffix>=``.

    Each ratio is that runtime configuration's req/s over the best peer's; the torch line
    is left out when that row is missing or failed.
    """
    best = best_peer(rows, profile)
    mine = {r.server: r for r in rows if r.profile == profile and r.ok}
    torch_row = mine.get(OURS_TORCH.name)
    if best is None or best.throughput_rps <= 0:
        return [f"best_peer{suffix}=none", f"vs_best_peer{suffix}=nan"]
    lines = (
        []
        if torch_row is None
        else [f"vs_best_peer_torch{suffix}={torch_row.throughput_rps / best.throughput_rps:.2f}"]
    )
    ours = mine.get(OURS.name)
    ratio = "nan" if ours is None else f"{ours.throughput_rps / best.throughput_rps:.2f}"
    return [*lines, f"best_peer{suffix}={best.server}", f"vs_best_peer{suffix}={ratio}"]


def _table(rows: Sequence[Row], profile: str) -> Table:
    """Return one profile's side-by-side table."""
    table = Table(title=f"MiniLM, 64-client closed loop, profile {profile}")
    columns = ("server", "version", "req/s", "p50 ms", "p99 ms", "mean batch", "cpu ms/req")
    for column in (*columns, "errors"):
        table.add_column(column, justify="left" if column in ("server", "version") else "right")
    for r in rows:
        if r.profile != profile:
            continue
        if not r.ok:
            table.add_row(r.server, r.version, "failed", "", "", "", "", r.reason.splitlines()[0])
            continue
        batch = "n/a" if r.mean_batch is None else f"{r.mean_batch:.2f}"
        errors = f"{r.errors}/{r.sent}" + (" (time limit)" if r.timed_out else "")
        table.add_row(
            r.server,
            r.version,
            f"{r.throughput_rps:.1f}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            batch,
            f"{r.cpu_ms_per_request:.1f}",
            errors,
        )
    return table


def print_report(rows: Sequence[Row], context: dict[str, Any], profiles: Sequence[str]) -> None:
    """Print a table per profile, the JSON of everything, then the closing lines.

    The headline profile (the first) closes the output, so ``tail -2`` reads its lines.
    """
    console = Console(width=140)
    for profile in profiles:
        console.print(_table(rows, profile))
    document = {"context": context, "results": [asdict(r) for r in rows]}
    print(json.dumps(document, indent=2, default=str))
    for profile in profiles[1:]:
        print("\n".join(closing_lines(rows, profile, suffix=f"_{profile}")))
    print("\n".join(closing_lines(rows, profiles[0])))


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    """Split a comma list and check every name is known."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{what}: choose from {', '.join(known)}")
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; ``--quick`` shrinks the counts for a first look."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_closed_loop_options(parser, per="run")
    parser.add_argument(
        "--peers",
        type=lambda t: _names(t, list(PEERS), "--peers"),
        default=list(PEERS),
        help=f"comma list of peers (default: {','.join(PEERS)})",
    )
    parser.add_argument(
        "--profile",
        dest="profiles",
        type=lambda t: _names(t, sorted(PROFILES), "--profile"),
        default=["mixed", "short"],
        help="comma list of length profiles; the first is the headline (default: mixed,short)",
    )
    parser.add_argument("--quick", action="store_true", help="300 requests, 64 warm-up")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0, help="per server start")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "fleetserve" / "peers",
        help="where the peers' virtualenvs are built",
    )
    parser.add_argument(
        "--install-only", action="store_true", help="build the peers' virtualenvs and exit"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.warmup = 300, 64
    return args


def install(args: argparse.Namespace) -> int:
    """Build every selected peer's virtualenv; print where, or why not; 1 if any failed."""
    failed = 0
    for name in args.peers:
        if not PEERS[name].venv:
            continue
        try:
            print(f"{name}: {ensure_venv(name, args.cache_dir)}")
        except PeerUnavailable as error:
            print(f"{name}: not installed: {error}")
            failed = 1
    return failed


def main(argv: Sequence[str] | None = None) -> None:
    """Build the missing virtualenvs, measure every server, print the report."""
    args = parse_args(argv)
    if args.install_only:
        sys.exit(install(args))
    clock = RunClock()
    pin_current_process(args.client_core)
    with tempfile.TemporaryDirectory(prefix="fleetserve-peers-") as log_dir:
        rows = measure_all(args, Path(log_dir))
    context = clock.context(args, omit={"cache_dir"})
    print_report(rows, context, args.profiles)


if __name__ == "__main__":
    main()
