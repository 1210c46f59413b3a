"""Whether a container reached its memory limit, read from its cgroup v1 memory controller.

On this host's cgroup v1 layout podman reports ``OOMKilled: false`` for a container the kernel
killed for memory; what the kernel counted is still in the container's cgroup until podman
removes it, a few hundred milliseconds after the exit: ``oom_kill`` in ``memory.oom_control``,
and ``memory.max_usage_in_bytes`` at ``memory.limit_in_bytes``.  `MemoryWatch` reads them while
the container runs, so the runner can tell an OOM kill from any other SIGKILL (exit 137).
"""

from __future__ import annotations

import threading
from pathlib import Path

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


def memory_cgroup(pid: int, *, proc: Path = Path("/proc"), root: Path = MEMORY_ROOT) -> Path | None:
    """The cgroup v1 memory directory of process `pid`; None without one (or the process)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return root / path.lstrip("/")
    return None


def reached_limit(oom_control: str, max_usage: int, limit: int) -> bool:
    """Whether the counters say the cgroup ran out of memory: an OOM kill, or usage at the limit."""
    counters = dict(line.split() for line in oom_control.splitlines() if len(line.split()) == 2)
    return int(counters.get("oom_kill", "0")) > 0 or max_usage >= limit


def read_reached_limit(cgroup: Path) -> bool | None:
    """`reached_limit` of the cgroup now; None once the cgroup is gone."""
    try:
        oom_control = (cgroup / "memory.oom_control").read_text(encoding="ascii")
        max_usage = int((cgroup / "memory.max_usage_in_bytes").read_text(encoding="ascii"))
        limit = int((cgroup / "memory.limit_in_bytes").read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    return reached_limit(oom_control, max_usage, limit)


class MemoryWatch:
    """Polls a cgroup until it disappears; `reached` turns True once it ran out of memory."""

    def __init__(self, cgroup: Path, interval_s: float = 0.05) -> None:
        """Read `cgroup` once now, then every `interval_s` seconds in a daemon thread."""
        self.reached = bool(read_reached_limit(cgroup))
        self._cgroup = cgroup
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memwatch-{cgroup.name}")
        self._thread.daemon = True
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            reached = read_reached_limit(self._cgroup)
            if reached is None:
                return
            self.reached = self.reached or reached
            self._stop.wait(self._interval_s)

    def wait_gone(self, timeout_s: float) -> bool:
        """Wait until the cgroup is gone (the last counters read); return `reached`."""
        self._thread.join(timeout=timeout_s)
        return self.reached

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(timeout=5)
