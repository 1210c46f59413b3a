"""Reading whether a container reached its memory limit from its cgroup v1 memory controller."""

from __future__ import annotations

from pathlib import Path

from fleetserve_e2e.cgroup_memory import (
    MemoryWatch,
    memory_cgroup,
    reached_limit,
    read_reached_limit,
)

OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
LIMIT = 64 * 2**20


def test_the_memory_cgroup_is_found_from_the_processes_cgroup_file(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(
        "5:devices:/libpod_parent/libpod-abc\n4:memory:/libpod_parent/libpod-abc\n0::/\n"
    )
    root = tmp_path / "memory"
    assert memory_cgroup(42, proc=proc, root=root) == root / "libpod_parent" / "libpod-abc"
    assert memory_cgroup(43, proc=proc, root=root) is None


def test_an_oom_kill_or_usage_at_the_limit_is_reaching_it() -> None:
    assert reached_limit(OOM_CONTROL.format(kills=1), LIMIT // 2, LIMIT)
    assert reached_limit(OOM_CONTROL.format(kills=0), LIMIT, LIMIT)
    assert not reached_limit(OOM_CONTROL.format(kills=0), LIMIT - 4096, LIMIT)


def _cgroup(path: Path, *, kills: int, max_usage: int) -> Path:
    path.mkdir(exist_ok=True)
    (path / "memory.oom_control").write_text(OOM_CONTROL.format(kills=kills))
    (path / "memory.max_usage_in_bytes").write_text(f"{max_usage}\n")
    (path / "memory.limit_in_bytes").write_text(f"{LIMIT}\n")
    return path


def test_the_counters_are_read_while_the_cgroup_exists(tmp_path: Path) -> None:
    cgroup = _cgroup(tmp_path / "c", kills=1, max_usage=LIMIT)
    assert read_reached_limit(cgroup) is True
    assert read_reached_limit(tmp_path / "gone") is None


def test_the_watch_keeps_what_it_saw_once_the_cgroup_is_gone(tmp_path: Path) -> None:
    cgroup = _cgroup(tmp_path / "c", kills=1, max_usage=LIMIT)
    watch = MemoryWatch(cgroup, interval_s=0.01)
    for name in ("memory.oom_control", "memory.max_usage_in_bytes", "memory.limit_in_bytes"):
        (cgroup / name).unlink()
    assert watch.wait_gone(timeout_s=5)


def test_a_cgroup_that_never_reached_its_limit_is_no_oom(tmp_path: Path) -> None:
    cgroup = _cgroup(tmp_path / "c", kills=0, max_usage=LIMIT // 2)
    watch = MemoryWatch(cgroup, interval_s=0.01)
    (cgroup / "memory.oom_control").unlink()
    assert not watch.wait_gone(timeout_s=5)
