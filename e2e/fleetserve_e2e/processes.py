"""Start and stop the harness's child processes, each in its own process group.

Control-plane binaries and pod processes are started here so teardown can always find and
stop them: every child leads its own session, and ``stop`` signals the whole group (SIGTERM,
then SIGKILL after a grace period) and reaps it, leaving no zombie and no orphan behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from fleetserve_e2e.waiting import GiveUpError

# Every process a cluster starts carries this variable, so leftovers can be found in /proc even
# if the harness itself was killed before it could clean up.
MARKER_ENV = "E2E_HARNESS_CLUSTER"


class ProcessExitedError(GiveUpError):
    """A process the harness is waiting for has exited; the message holds its log tail."""


@dataclass
class ManagedProcess:
    """A child process started by the harness, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        """The process id, which is also its process-group id."""
        return self.popen.pid

    def is_running(self) -> bool:
        """Return whether the process has not exited yet."""
        return self.popen.poll() is None

    def exit_code(self) -> int | None:
        """Return the exit status, or None while it runs."""
        return self.popen.poll()

    def ensure_running(self) -> None:
        """Raise :class:`ProcessExitedError` with the log tail if the process has exited."""
        code = self.exit_code()
        if code is not None:
            raise ProcessExitedError(f"{self.name} exited with {code}:\n{self.log_tail()}")

    def answers(self, url: str) -> bool:
        """Whether `url` answers 2xx, the process still running.

        A `wait_until` condition: a refused connection is "not yet", an exited process ends
        the wait.
        """
        self.ensure_running()
        return httpx.get(url, timeout=1.0, trust_env=False).is_success

    def log_tail(self, max_chars: int = 4000) -> str:
        """Return the end of the log, for error messages."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-max_chars:]
        except FileNotFoundError:
            return ""

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the process group: SIGTERM, wait up to ``grace_s`` seconds, then SIGKILL."""
        if self.is_running():
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=grace_s)
        # Children the leader left behind in its group die with it, even after a clean exit.
        _signal_group(self.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group, ignoring one that is already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return


def start_process(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ManagedProcess:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    return ManagedProcess(name=name, popen=popen, log_path=log_path)


def is_pid_alive(pid: int) -> bool:
    """Return whether a process with this pid exists (used by teardown tests and cluster-down)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_marked(marker: str) -> list[int]:
    """Return the pids of live processes whose environment has ``MARKER_ENV=marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(proc.name))
    return found
