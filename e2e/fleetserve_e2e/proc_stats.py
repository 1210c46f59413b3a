"""CPU and memory read from ``/proc``: one process's (the operator's), and the whole machine's."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessSampler:
    """Samples a process's RSS while it runs, and reads its peak RSS and CPU time."""

    pid: int
    interval_s: float = 0.5
    samples_mb: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        """Sample in a daemon thread until `stop`."""
        threading.Thread(target=self._run, name="rss-sampler", daemon=True).start()

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples_mb.append(self.status_mb("VmRSS"))
            except (OSError, KeyError):
                return

    def status_mb(self, key: str) -> float:
        """A ``kB`` field of ``/proc/<pid>/status`` (VmRSS, VmHWM) in MB."""
        for line in Path(f"/proc/{self.pid}/status").read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0]) / 1024
        raise KeyError(key)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process so far."""
        # Fields after the parenthesised command name; utime and stime are the 14th and 15th.
        fields = Path(f"/proc/{self.pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1]
        utime, stime = fields.split()[11:13]
        return (int(utime) + int(stime)) / _CLK_TCK


def busy_s(stat: str) -> float:
    """The busy CPU seconds, all cores together, in the text of ``/proc/stat``.

    Busy is user, nice, system, irq and softirq time: not idle or iowait, and not steal (a
    neighbour's time on a shared host). Guest time is already counted in user and nice.
    """
    ticks = [int(value) for value in stat.splitlines()[0].split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = ticks
    return (user + nice + system + irq + softirq) / _CLK_TCK


def machine_busy_s() -> float:
    """The machine's busy CPU seconds since boot (`busy_s` of ``/proc/stat``).

    Over a window on a quiet machine: what the control plane, the operator and the driver
    spent together.
    """
    return busy_s(Path("/proc/stat").read_text(encoding="ascii"))
