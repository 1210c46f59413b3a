"""Core pinning and single-threaded environments for the benchmark's child processes.

Protocol §7.1: the server (and the GEMM probe that measures its core's peak) run on one core
with one thread; the load generator runs on another, so they never compete for a core.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

#: Thread-pool variables that would otherwise let BLAS/OpenMP spread over every core.
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def pinned_command(argv: Sequence[str], *, core: int) -> list[str]:
    """Return ``argv`` prefixed so that it runs on ``core`` only, threads included.

    ``taskset`` sets the affinity before exec, so every thread the child ever starts
    inherits it; setting it from the parent after the start would race torch's pools.

    Raises:
        RuntimeError: If ``taskset`` (util-linux) is missing.
    """
    taskset = shutil.which("taskset")
    if taskset is None:
        raise RuntimeError("taskset (util-linux) is required to pin the server to a core")
    return [taskset, "-c", str(core), *argv]


def single_thread_env() -> dict[str, str]:
    """Return this process's environment with BLAS/OpenMP limited to one thread."""
    return {**os.environ, **_ONE_THREAD}


def pin_current_process(core: int) -> None:
    """Pin the calling process (the load generator) to ``core``."""
    os.sched_setaffinity(0, {core})
