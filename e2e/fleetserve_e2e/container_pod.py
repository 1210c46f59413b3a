"""Run one pod's `ContainersPlan` with podman, one step per sync of the fake kubelet.

`PodContainers` is a small state machine the runner advances with :meth:`refresh`: it writes
the pod's volumes, runs the init containers one at a time to completion (a failed one again
after the restart delay, restartCount + 1, its termination message kept for the status), then
starts the main container and watches its memory cgroup, so an exit 137 at the memory limit
reads as ``OOMKilled``.  Each container's podman runs in a directory of its own, where conmon
drops its ``oom`` marker when the kernel killed the container for memory (podman, on this
host's cgroup v1 layout, never reads that marker back: its State.OOMKilled stays false).
Stopping removes every container of the pod by its uid label.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetserve_e2e.cgroup_memory import MemoryWatch, memory_cgroup
from fleetserve_e2e.images.containers import run_argv
from fleetserve_e2e.images.podman import (
    container_state,
    image_exists,
    logs_tail,
    podman,
    remove_containers,
)
from fleetserve_e2e.images.registry import PullOptions
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pod_containers import (
    CLUSTER_LABEL,
    POD_UID_LABEL,
    ContainersPlan,
    HostVolume,
    PlannedContainer,
    PodSpecError,
    volume_file_paths,
)
from fleetserve_e2e.pod_status import termination_reason, timestamp

OOM_KILLED = "OOMKilled"
CONMON_OOM_FILE = "oom"
_SIGKILL_EXIT = 137
_MESSAGE_LIMIT = 4096
_FALLBACK_LOG_LINES = 80
_CGROUP_GONE_S = 3.0


@dataclass
class _InitRun:
    """What one init container did so far, as its status reports it."""

    restart_count: int = 0
    state: JsonObject = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    last_state: JsonObject = field(default_factory=dict)
    exited_at: float | None = None


def write_volume(
    pod_dir: Path, volume: HostVolume, token: str | None, fs_group: int | None = None
) -> None:
    """Create a volume's host directory with its files (and the pod's token, if it mounts one).

    A hostPath is the node's: made as a kubelet makes a missing ``DirectoryOrCreate`` (0755,
    owned by root), otherwise left as it is. With the pod's ``fsGroup``, files are group-owned
    by it and group-readable, as a kubelet's volume ownership makes them: a non-root user in
    that group reads a Secret of mode 0440.

    Raises:
        PodSpecError: A hostPath of type ``Directory`` is missing on the node.
    """
    if volume.node_path is not None:
        if volume.create:
            volume.node_path.mkdir(mode=0o755, parents=True, exist_ok=True)
        elif not volume.node_path.is_dir():
            raise PodSpecError(f"volume {volume.name!r}: {volume.node_path} is not a directory")
        return
    root = pod_dir / volume.dir_name
    root.mkdir(parents=True, exist_ok=True)
    # An emptyDir is world-writable, as a kubelet makes it: the pod runs as any user.
    root.chmod(0o777 if not volume.read_only else 0o755)
    for path, item in zip(volume_file_paths(volume), volume.files, strict=True):
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(item.content)
        if fs_group is None:
            target.chmod(item.mode)
        else:
            os.chown(target, 0, fs_group)
            target.chmod(item.mode | 0o440)
    if volume.token_file is not None and token is not None:
        target = root / volume.token_file
        target.write_text(token, encoding="utf-8")
        target.chmod(0o644)


class PodContainers:
    """The containers of one pod; the runner calls :meth:`refresh` once per sync."""

    def __init__(
        self,
        plan: ContainersPlan,
        pod_dir: Path,
        *,
        restart_delay_s: float,
        pull: PullOptions,
        token: str | None = None,
    ) -> None:
        """Write the pod's volumes; nothing runs before the first :meth:`refresh`."""
        self.plan = plan
        self._pod_dir = pod_dir
        self._delay_s = restart_delay_s
        self._pull = pull
        self._runs = [_InitRun() for _ in plan.init]
        self._next_init = 0
        self._main_started = False
        self._state: dict[str, Any] | None = None
        self._watch: MemoryWatch | None = None
        pod_dir.mkdir(parents=True, exist_ok=True)
        for volume in plan.volumes:
            write_volume(pod_dir, volume, token, plan.fs_group)

    # -- the runner's view ------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The host pid of the main container's process; 0 when it does not run."""
        return int(self._state.get("Pid", 0)) if self._state and self.is_running() else 0

    def initialized(self) -> bool:
        """Whether every init container has completed."""
        return self._next_init >= len(self.plan.init)

    def is_running(self) -> bool:
        """Whether the main container runs."""
        return bool(self._state and self._state.get("Status") == "running")

    def exit_code(self) -> int | None:
        """The main container's exit code once it exited; None while it runs or waits."""
        if self._state is None or self._state.get("Status") not in ("exited", "stopped"):
            return None
        return int(self._state["ExitCode"])

    def exit_reason(self) -> str | None:
        """``OOMKilled`` when podman or the memory cgroup says so, else the kubelet's reason."""
        code = self.exit_code()
        if code is None:
            return None
        if self._oom_marked(self.plan.main) or (self._state and self._state.get("OOMKilled")):
            return OOM_KILLED
        # podman misses OOM kills on cgroup v1 here; the cgroup's counters do not.
        if code == _SIGKILL_EXIT and self._watch and self._watch.wait_gone(_CGROUP_GONE_S):
            return OOM_KILLED
        return termination_reason(code)

    def init_statuses(self) -> tuple[JsonObject, ...]:
        """``initContainerStatuses`` as a kubelet reports them."""
        return tuple(
            {
                "name": planned.name,
                "image": planned.spec.image,
                "imageID": "",
                "containerID": "",
                "ready": "terminated" in run.state and run.state["terminated"]["exitCode"] == 0,
                "started": "running" in run.state,
                "restartCount": run.restart_count,
                "state": run.state,
                "lastState": run.last_state,
            }
            for planned, run in zip(self.plan.init, self._runs, strict=True)
        )

    def refresh(self) -> None:
        """Advance one step: the next init container, the main container's start, its state."""
        if not self.initialized():
            self._advance_init()
        elif not self._main_started:
            self._run(self.plan.main)
            self._main_started = True
            self._state = container_state(self.plan.main.container_name)
            self._watch_memory()
        else:
            self._state = container_state(self.plan.main.container_name)

    def restart(self) -> None:
        """Start the exited main container again (same container, volumes and ports)."""
        self._reset_termination(self.plan.main)
        podman(
            ["start", self.plan.main.container_name],
            timeout_s=120,
            cwd=self._conmon_dir(self.plan.main),
        )
        self._state = container_state(self.plan.main.container_name)
        self._watch_memory()

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop and remove every container of the pod, then its host directory."""
        if self._watch is not None:
            self._watch.stop()
        uid = self.plan.labels[POD_UID_LABEL]
        remove_containers(f"{POD_UID_LABEL}={uid}", grace_s=int(grace_s))
        self._state = None
        shutil.rmtree(self._pod_dir, ignore_errors=True)

    # -- steps ------------------------------------------------------------------------------

    def _advance_init(self) -> None:
        planned = self.plan.init[self._next_init]
        run = self._runs[self._next_init]
        if "running" not in run.state:
            if run.exited_at is not None and time.monotonic() - run.exited_at < self._delay_s:
                return
            if run.exited_at is not None:
                run.last_state = run.state
                run.restart_count += 1
            self._run(planned)
            run.state = {"running": {"startedAt": timestamp()}}
            return
        state = container_state(planned.container_name)
        if state is None or state.get("Status") not in ("exited", "stopped"):
            return
        code = int(state["ExitCode"])
        terminated: JsonObject = {
            "exitCode": code,
            "reason": OOM_KILLED
            if state.get("OOMKilled") or self._oom_marked(planned)
            else termination_reason(code),
            "startedAt": run.state["running"]["startedAt"],
            "finishedAt": timestamp(),
        }
        message = self._termination_message(planned, code)
        if message:
            terminated["message"] = message
        run.state = {"terminated": terminated}
        run.exited_at = time.monotonic()
        podman(["rm", "--force", planned.container_name], timeout_s=120)
        if code == 0:
            self._next_init += 1

    def _termination_message(self, planned: PlannedContainer, code: int) -> str:
        """What the container wrote to its termination message file, else its log's tail."""
        path = self._pod_dir / planned.termination_file
        message = path.read_text(encoding="utf-8", errors="replace")[:_MESSAGE_LIMIT]
        if not message and planned.fallback_to_logs and code != 0:
            message = logs_tail(planned.container_name, _FALLBACK_LOG_LINES)[-_MESSAGE_LIMIT:]
        return message

    def _reset_termination(self, planned: PlannedContainer) -> None:
        """Empty the termination message file and conmon's OOM marker before a (re)start."""
        path = self._pod_dir / planned.termination_file
        path.write_bytes(b"")
        path.chmod(0o666)  # the container writes it as its own user
        (self._conmon_dir(planned) / CONMON_OOM_FILE).unlink(missing_ok=True)

    def _conmon_dir(self, planned: PlannedContainer) -> Path:
        """The working directory of podman (and so conmon) for one container."""
        path = self._pod_dir / f"conmon-{planned.name}"
        path.mkdir(exist_ok=True)
        return path

    def _oom_marked(self, planned: PlannedContainer) -> bool:
        """Whether conmon marked the container's last run as killed for memory."""
        return (self._conmon_dir(planned) / CONMON_OOM_FILE).exists()

    def _run(self, planned: PlannedContainer) -> None:
        image = planned.spec.image
        if not image_exists(image):
            podman(self._pull.argv(image), timeout_s=600)
        self._reset_termination(planned)
        # A leftover of an earlier attempt (the runner restarted, a failed start) goes first.
        podman(["rm", "--force", "--ignore", planned.container_name], timeout_s=120)
        argv = run_argv(planned.spec, planned.container_name, detach=True)
        podman(argv, timeout_s=300, cwd=self._conmon_dir(planned))

    def _watch_memory(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        self._watch = None
        pid = int(self._state.get("Pid", 0)) if self._state else 0
        cgroup = memory_cgroup(pid) if pid else None
        if cgroup is not None:
            self._watch = MemoryWatch(cgroup)


def remove_cluster_containers(marker: str) -> list[str]:
    """Remove the containers of every pod a cluster (by its marker) ran; none without podman."""
    if shutil.which("podman") is None:
        return []
    return remove_containers(f"{CLUSTER_LABEL}={marker}")
