"""Keep a harness component running in the background between make targets.

``make cluster-up`` must return while the cluster keeps running, so the component runs in a
detached ``python -m fleetserve_e2e run-…`` process.  That process writes ``ready.json`` (the
facts callers need, e.g. the kubeconfig path) once the component is up, and shuts it down
cleanly on SIGTERM.  The state directory holds the pid, the ready file and the daemon's log.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

from fleetserve_e2e.container_pod import remove_cluster_containers
from fleetserve_e2e.paths import E2E_DIR
from fleetserve_e2e.processes import (
    ManagedProcess,
    find_marked,
    is_pid_alive,
    start_process,
)
from fleetserve_e2e.waiting import wait_until

READY_FILE = "ready.json"
PID_FILE = "daemon.pid"
LOG_FILE = "daemon.log"


def running_info(state: Path) -> dict[str, str] | None:
    """Return the ready facts of a live daemon in ``state``, or None when none runs."""
    try:
        pid = int((state / PID_FILE).read_text(encoding="utf-8"))
        info: dict[str, str] = json.loads((state / READY_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return info if is_pid_alive(pid) else None


def spawn(args: list[str], state: Path, *, timeout_s: float) -> dict[str, str]:
    """Start ``python -m fleetserve_e2e <args>`` detached and wait for its ready file."""
    state.mkdir(parents=True, exist_ok=True)
    (state / READY_FILE).unlink(missing_ok=True)
    pythonpath = os.pathsep.join(filter(None, [str(E2E_DIR), os.environ.get("PYTHONPATH")]))
    process = start_process(
        "daemon",
        [sys.executable, "-m", "fleetserve_e2e", *args],
        log_path=state / LOG_FILE,
        env={**os.environ, "PYTHONPATH": pythonpath},
    )
    (state / PID_FILE).write_text(str(process.pid), encoding="utf-8")
    try:
        return wait_until(
            lambda: _ready_info(process, state),
            timeout_s=timeout_s,
            what=f"the daemon in {state} (log: {state / LOG_FILE})",
            interval_s=0.2,
        )
    except BaseException:
        stop_daemon(state, timeout_s=timeout_s)  # a half-started daemon must not linger
        raise


def _ready_info(process: ManagedProcess, state: Path) -> dict[str, str] | None:
    process.ensure_running()
    path = state / READY_FILE
    if not path.is_file():
        return None
    info: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    return info


def serve(state: Path, info: dict[str, str]) -> None:
    """Inside the daemon: publish ``info`` as ready, then block until SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    partial = state / f".{READY_FILE}.partial"
    partial.write_text(json.dumps(info, indent=2), encoding="utf-8")
    partial.replace(state / READY_FILE)
    for key, value in info.items():
        print(f"{key}={value}", flush=True)
    stop.wait()
    (state / READY_FILE).unlink(missing_ok=True)


def stop_daemon(state: Path, *, timeout_s: float) -> bool:
    """Stop the daemon in ``state`` and anything it left behind; return whether one ran.

    SIGTERM lets the daemon tear its component down in order.  If it does not exit in time it
    is killed, and every process still carrying the state directory as its cluster marker is
    killed too, so nothing outlives ``make cluster-down``.
    """
    try:
        pid = int((state / PID_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return False
    was_running = is_pid_alive(pid)
    if was_running:
        os.kill(pid, signal.SIGTERM)
        try:
            wait_until(lambda: not is_pid_alive(pid), timeout_s=timeout_s, what=f"pid {pid}")
        except TimeoutError:
            _kill(pid)
    for leftover in find_marked(str(state)):
        _kill(leftover)
    remove_cluster_containers(str(state))
    (state / PID_FILE).unlink(missing_ok=True)
    (state / READY_FILE).unlink(missing_ok=True)
    return was_running


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
