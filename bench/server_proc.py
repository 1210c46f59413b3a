"""Start a server as a pinned child process, wait until it is ready, always stop it.

``bench.runtime_bench`` runs each server configuration in a fresh process through
``running_server``. The child gets its own process group, so stopping it also stops anything
it spawned (uvicorn workers, tokenizer pools).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from bench.pinning import pinned_command, single_thread_env

#: Grace period between SIGTERM and SIGKILL when stopping a server.
STOP_GRACE_S = 15.0


def runtime_serve_argv(runtime: Sequence[str], *, model: str, name: str, port: int) -> list[str]:
    """Return ``fleetserve-runtime serve`` as every benchmark starts it.

    ``model`` served as ``name`` version v1 on 127.0.0.1:``port``, on the CPU with one torch
    thread; each benchmark appends the flags of its configurations.
    """
    return [
        *runtime,
        "serve",
        f"--model={model}",
        f"--name={name}",
        "--version=v1",
        "--host=127.0.0.1",
        f"--port={port}",
        "--device=cpu",
        "--threads=1",
    ]


def add_closed_loop_options(parser: argparse.ArgumentParser, *, per: str = "config") -> None:
    """Add the server and closed-loop load options the MiniLM benchmarks share.

    The runtime, precision and peers benches take the same defaults so that their numbers
    compare; ``per`` names what one ``--requests`` / ``--warmup`` count is spent on.
    """
    default_runtime = str(Path(sys.executable).with_name("fleetserve-runtime"))
    parser.add_argument("--runtime", default=default_runtime, help="server command (shell words)")
    parser.add_argument("--model", default="builtin://minilm-l6")
    parser.add_argument("--requests", type=int, default=1500, help=f"measured requests per {per}")
    parser.add_argument("--warmup", type=int, default=256, help=f"unmeasured requests per {per}")
    parser.add_argument("--concurrency", type=int, default=64, help="closed-loop clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-queue-delay-ms", type=float, default=10.0)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--time-limit-s", type=float, default=300.0, help="per measured run")


def _is_ready(ready_url: str) -> bool:
    """Return True if ``GET ready_url`` answers 200."""
    try:
        with urllib.request.urlopen(ready_url, timeout=2.0) as response:
            status: int = response.status
            return status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _wait_ready(
    process: subprocess.Popen[bytes],
    *,
    ready_url: str,
    log_path: Path,
    timeout_s: float,
) -> None:
    """Poll readiness until it succeeds; fail fast if the server exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    while not _is_ready(ready_url):
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{_tail(log_path)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"server not ready after {timeout_s:.0f} s:\n{_tail(log_path)}")
        time.sleep(0.25)


def _tail(log_path: Path, lines: int = 30) -> str:
    """Return the last ``lines`` lines of the server's log."""
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def process_cpu_seconds(pid: int) -> float:
    """Return the CPU time (user + system, all threads) that process ``pid`` has used so far.

    The bench reads it around the measured window: a saturated server near 1.0 CPU-s per
    second owns its core; much less means it was waiting, or the core was shared.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of proc(5); fields[0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _signal_group(pid: int, signum: signal.Signals) -> None:
    """Send ``signum`` to the process group led by ``pid``, if it still exists."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL after a grace period."""
    _signal_group(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_S)
    # SIGKILL whatever is left: a hung server, or children it left behind in its group.
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def running_server(
    argv: Sequence[str],
    *,
    base_url: str,
    core: int,
    log_path: Path,
    ready_timeout_s: float = 180.0,
    ready_path: str = "/v2/health/ready",
    env: Mapping[str, str] | None = None,
) -> Iterator[int]:
    """Run ``argv`` pinned to ``core`` until the ``with`` block ends.

    Args:
        argv: Server command line; it must listen at ``base_url``.
        base_url: ``http://127.0.0.1:<port>`` of the server.
        core: CPU core for the server and all its threads.
        log_path: File that receives the server's stdout and stderr.
        ready_timeout_s: How long model loading and warm-up may take.
        ready_path: Path under ``base_url`` that answers 200 once the server is ready.
        env: Variables set for the server on top of the one-thread environment.

    Yields:
        The server's process id; the server is ready when the block starts.
    """
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            pinned_command(argv, core=core),
            env={**single_thread_env(), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_ready(
                process,
                ready_url=f"{base_url}{ready_path}",
                log_path=log_path,
                timeout_s=ready_timeout_s,
            )
            yield process.pid
        finally:
            _stop(process)
