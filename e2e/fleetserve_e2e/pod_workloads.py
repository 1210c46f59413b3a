"""What runs a pod for the fake kubelet: its local process or its containers, one interface.

`PodRunner` supervises a `PodProcess`: the workload (`ProcessWorkload` around a local
process, or `container_pod.PodContainers`), the plan it was launched from and what the
harness last observed of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pod_containers import (
    ContainersPlan,
)
from fleetserve_e2e.pod_launch import (
    LOOPBACK,
    LaunchPlan,
)
from fleetserve_e2e.pod_status import Observation, termination_reason
from fleetserve_e2e.processes import ManagedProcess, start_process


class Workload(Protocol):
    """What runs a pod: its local process, or its containers."""

    @property
    def pid(self) -> int:
        """The host pid of the pod's main process."""
        ...

    def refresh(self) -> None:
        """Take one step and read the state anew (containers: one podman inspect)."""
        ...

    def initialized(self) -> bool:
        """Whether the init containers have completed (always, for a process)."""
        ...

    def init_statuses(self) -> tuple[JsonObject, ...]:
        """``initContainerStatuses``; empty when nothing ran before the main container."""
        ...

    def is_running(self) -> bool:
        """Whether the main process runs."""
        ...

    def exit_code(self) -> int | None:
        """Its exit status once it exited, else None."""
        ...

    def exit_reason(self) -> str | None:
        """The termination reason of the exit, None while it runs."""
        ...

    def restart(self) -> None:
        """Run the main process again."""
        ...

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop everything the pod runs."""
        ...


@dataclass
class ProcessWorkload:
    """A pod's container run as a local process from its `LaunchPlan`."""

    plan: LaunchPlan
    log_path: Path
    cwd: Path
    process: ManagedProcess = field(init=False)

    def __post_init__(self) -> None:
        self.restart()

    @property
    def pid(self) -> int:
        """The process's pid (and process group)."""
        return self.process.pid

    def refresh(self) -> None:
        """Nothing to do: the process's state is read on demand."""

    def initialized(self) -> bool:
        """Init containers are not run for processes."""
        return True

    def init_statuses(self) -> tuple[JsonObject, ...]:
        """None ran."""
        return ()

    def is_running(self) -> bool:
        """Whether the process has not exited."""
        return self.process.is_running()

    def exit_code(self) -> int | None:
        """The exit status once it exited."""
        return self.process.exit_code()

    def exit_reason(self) -> str | None:
        """Completed or Error, from the exit status."""
        code = self.exit_code()
        return None if code is None else termination_reason(code)

    def restart(self) -> None:
        """Start the process (again)."""
        plan = self.plan
        self.process = start_process(
            self.log_path.stem, plan.argv, log_path=self.log_path, env=plan.env, cwd=self.cwd
        )

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the process group."""
        self.process.stop(grace_s=grace_s)


@dataclass
class PodProcess:
    """A Fleetserve pod's workload (process or containers) and what the harness observed."""

    plan: LaunchPlan | ContainersPlan
    process: Workload
    seen: Observation
    exited_at: float | None = None

    @property
    def address(self) -> str | None:
        """``<pod IP>:<port>`` of a runtime's inference API; None for the operator."""
        port = self.plan.serving_port
        return None if port is None else f"{self.ip}:{port}"

    @property
    def grpc_address(self) -> str | None:
        """``<pod IP>:<port>`` of a runtime's gRPC listener; None when it has none."""
        port = self.plan.grpc_port
        return None if port is None else f"{self.ip}:{port}"

    @property
    def ip(self) -> str:
        """Where the pod listens: its own address (pod network) or 127.0.0.1."""
        return self.plan.host if isinstance(self.plan, LaunchPlan) else LOOPBACK
