"""Run an image as a hardened container, the way a restricted pod runs it, and look inside.

``ContainerSpec`` says what a pod's securityContext and resources say (user, read-only root,
dropped capabilities, no privilege escalation, memory, CPU and process limits, writable tmpfs
mounts, host directories and files bound in), which container ports are published on
127.0.0.1, and the labels that find it again; ``run_argv`` turns it into
``podman run`` arguments (pure), and ``Container`` runs it and answers what a test asks: its
state, logs, the files it changed outside its mounts, its health check.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetserve_e2e.images.podman import (
    PodmanError,
    container_options,
    container_state,
    executable,
    podman,
)
from fleetserve_e2e.lifecycle import Component

LOOPBACK = "127.0.0.1"
SLIRP_HOST_LOOPBACK = "10.0.2.2"
"""The address at which a container on slirp4netns with ``allow_host_loopback`` reaches the
host's 127.0.0.1."""


@dataclass(frozen=True)
class Mount:
    """A host directory or file bound into the container (a pod's volume mount)."""

    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """One container: image, arguments after its entrypoint, and how it is confined."""

    image: str
    args: tuple[str, ...] = ()
    entrypoint: str | None = None
    """None: the image's ENTRYPOINT; a JSON array replaces it with a whole command line."""
    user: str | None = None
    """None: the image's own USER."""
    read_only: bool = True
    tmpfs: dict[str, str] = field(default_factory=lambda: {"/tmp": "size=1g"})
    """Writable mounts: path → tmpfs options (a pod's emptyDir volumes)."""
    memory: str | None = None
    cpus: str | None = None
    pids_limit: int = 1024
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)
    """Container port → host port on 127.0.0.1."""
    mounts: tuple[Mount, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    drop_all_capabilities: bool = True
    no_new_privileges: bool = True
    groups: tuple[int, ...] = ()
    """Supplementary groups (a pod's ``fsGroup``), which may read the pod's Secret volumes."""
    host_names: tuple[str, ...] = ()
    """Names that resolve, inside the container, to the host's loopback: the servers a test
    runs on 127.0.0.1, named as a cluster's DNS would name them. With any, the container's
    network is slirp4netns with ``allow_host_loopback`` (netavark's bridge cannot reach the
    host's 127.0.0.1)."""


def _confinement(spec: ContainerSpec) -> list[str]:
    """Capabilities, privilege escalation, read-only root, user and limits."""
    args = ["--cap-drop", "ALL"] if spec.drop_all_capabilities else []
    if spec.no_new_privileges:
        args += ["--security-opt", "no-new-privileges"]
    args += ["--pids-limit", str(spec.pids_limit)]
    if spec.read_only:
        args.append("--read-only")
    if spec.user is not None:
        args += ["--user", spec.user]
    for group in spec.groups:
        args += ["--group-add", str(group)]
    if spec.memory is not None:
        # memory-swap equal to memory: over the limit is an OOM kill, never swapping.
        args += ["--memory", spec.memory, "--memory-swap", spec.memory]
    if spec.cpus is not None:
        args += ["--cpus", spec.cpus]
    return args


def _mounts(spec: ContainerSpec) -> list[str]:
    """Tmpfs mounts, then host directories and files."""
    args: list[str] = []
    for path, options in sorted(spec.tmpfs.items()):
        args += ["--tmpfs", f"{path}:{options}"]
    for mount in spec.mounts:
        options = ",ro" if mount.read_only else ""
        args += ["--mount", f"type=bind,source={mount.source},target={mount.target}{options}"]
    return args


def run_argv(spec: ContainerSpec, name: str, *, detach: bool) -> list[str]:
    """``podman run`` arguments: capabilities dropped, no privilege escalation, the limits."""
    args = ["run", *container_options(), "--name", name, *_confinement(spec)]
    args += ["--detach"] if detach else ["--rm"]
    args += _mounts(spec)
    for key, value in sorted(spec.labels.items()):
        args += ["--label", f"{key}={value}"]
    for key, value in sorted(spec.env.items()):
        args += ["--env", f"{key}={value}"]
    for container_port, host_port in sorted(spec.ports.items()):
        args += ["--publish", f"{LOOPBACK}:{host_port}:{container_port}"]
    if spec.host_names:
        args += ["--network", "slirp4netns:allow_host_loopback=true"]
        for name in spec.host_names:
            args += ["--add-host", f"{name}:{SLIRP_HOST_LOOPBACK}"]
    if spec.entrypoint is not None:
        args += ["--entrypoint", spec.entrypoint]
    return [*args, spec.image, *spec.args]


def run_once(spec: ContainerSpec, *, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Run ``spec`` to completion and return its exit code and output (never raises on exit)."""
    name = f"fleetserve-once-{secrets.token_hex(4)}"
    return subprocess.run(  # podman run, with arguments we build
        [executable(), *run_argv(spec, name, detach=False)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


class Container(Component):
    """A detached container, removed on exit."""

    def __init__(self, spec: ContainerSpec) -> None:
        self.spec = spec
        self.name = f"fleetserve-e2e-{secrets.token_hex(4)}"

    def _start(self) -> None:
        podman(run_argv(self.spec, self.name, detach=True), timeout_s=300)

    def close(self) -> None:
        """Remove the container (idempotent)."""
        subprocess.run(  # podman rm: best effort, the container may be gone already
            [executable(), "rm", "--force", "--time", "10", self.name],
            capture_output=True,
            check=False,
            timeout=120,
        )

    def url(self, container_port: int) -> str:
        """The published address of ``container_port``."""
        return f"http://{LOOPBACK}:{self.spec.ports[container_port]}"

    def state(self) -> dict[str, Any]:
        """``State`` of ``podman inspect``: Status, ExitCode, OOMKilled, ...

        Raises:
            PodmanError: The container is gone.
        """
        state = container_state(self.name)
        if state is None:
            raise PodmanError(f"container {self.name} is gone")
        return state

    def logs(self) -> str:
        """What the container wrote to stdout and stderr."""
        done = podman(["logs", self.name])
        return done.stdout + done.stderr

    def changed_paths(self) -> list[str]:
        """Paths the container added, changed or deleted in its image's filesystem.

        Mounts (tmpfs, volumes) are not part of it: this is what it wrote outside them.
        """
        done = podman(["diff", "--format", "json", self.name])
        changes: dict[str, Sequence[str] | None] = json.loads(done.stdout or "{}")
        return sorted(path for paths in changes.values() for path in paths or ())

    def healthy(self) -> bool:
        """Whether the image's HEALTHCHECK passes now (``podman healthcheck run``)."""
        return (
            subprocess.run(  # podman healthcheck run: exit 0 healthy, 1 not
                [executable(), "healthcheck", "run", self.name],
                capture_output=True,
                check=False,
                timeout=60,
            ).returncode
            == 0
        )
