"""The podman command line, with the options every container and build here needs.

runc, not crun: crun cannot set up containers on a host that mounts cgroup v1 controllers
beside the unified hierarchy. And explicit resource limits: podman's defaults (1048576 open
files, 32768 processes) are above what an unprivileged-for-resources sandbox may grant, and
runc then fails with "error setting rlimits"; the limits given are podman's, lowered to this
process's own hard limits, which a child may always keep.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OCI_RUNTIME = "runc"
PODMAN_NOFILE = 1048576
PODMAN_NPROC = 32768
"""podman's own defaults, kept where this process may grant them."""


class PodmanError(RuntimeError):
    """A podman command failed; the message holds the command and what it printed."""


def ulimit_options(nofile_hard: int, nproc_hard: int) -> list[str]:
    """``--ulimit`` options: podman's defaults, lowered to the given hard limits.

    ``RLIM_INFINITY`` (-1) means no hard limit, so podman's default stands.
    """

    def capped(default: int, hard: int) -> int:
        return default if hard == resource.RLIM_INFINITY else min(default, hard)

    nofile = capped(PODMAN_NOFILE, nofile_hard)
    nproc = capped(PODMAN_NPROC, nproc_hard)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def container_options() -> list[str]:
    """The options every ``podman run`` and ``podman build`` here takes."""
    _, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    _, nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)
    return ["--runtime", OCI_RUNTIME, *ulimit_options(nofile_hard, nproc_hard)]


def executable() -> str:
    """The podman binary, or a clear error naming the target that installs it."""
    found = shutil.which("podman")
    if found is None:
        raise PodmanError("podman is not installed; `make images-install` installs it")
    return found


def podman(
    args: Sequence[str], *, timeout_s: float = 3600.0, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``podman <args>``, returning its output, or raise `PodmanError` when it fails.

    `cwd` matters for ``run`` and ``start``: on this host conmon writes its ``oom`` marker
    file, when the kernel kills the container for memory, into the working directory.
    """
    argv = [executable(), *args]
    done = subprocess.run(  # podman, with arguments we build
        argv,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=cwd,
    )
    if done.returncode != 0:
        raise PodmanError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr.strip()}")
    return done


def image_exists(ref: str) -> bool:
    """Whether the local store holds ``ref``."""
    return (
        subprocess.run(  # podman image exists: exit 0 or 1
            [executable(), "image", "exists", ref], capture_output=True, check=False, timeout=60
        ).returncode
        == 0
    )


def try_pull(ref: str) -> str | None:
    """Pull ``ref``; None when it worked, else why not (no registry reachable, say)."""
    try:
        podman(["pull", "--quiet", ref], timeout_s=600)
    except PodmanError as exc:
        return str(exc).splitlines()[-1]
    return None


def image_size(ref: str) -> int:
    """The image's size in bytes, as ``podman images`` reports it (its layers, uncompressed)."""
    done = podman(["image", "inspect", "--format", "{{.Size}}", ref])
    return int(done.stdout.strip())


def image_labels(ref: str) -> dict[str, str]:
    """The image's labels."""
    done = podman(["image", "inspect", "--format", "{{json .Labels}}", ref])
    labels = json.loads(done.stdout) or {}
    return {str(key): str(value) for key, value in labels.items()}


def import_rootfs(root: Path, ref: str, *, cmd: Sequence[str]) -> None:
    """Import the directory ``root`` as the single-layer image ``ref`` (``podman import``)."""
    argv = [executable(), "import", "--change", f"CMD {json.dumps(list(cmd))}", "-", ref]
    with subprocess.Popen(  # tar of a directory we made
        ["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE
    ) as tar:
        done = subprocess.run(  # podman import, reading the tar stream
            argv, stdin=tar.stdout, capture_output=True, text=True, timeout=600, check=False
        )
    if tar.returncode != 0 or done.returncode != 0:
        raise PodmanError(f"importing {root} as {ref} failed:\n{done.stderr.strip()}")


def container_state(name: str) -> dict[str, Any] | None:
    """``State`` of ``podman container inspect`` (Status, ExitCode, OOMKilled, Pid, ...).

    None when no such container exists.
    """
    done = subprocess.run(  # podman container inspect: exit 125 when there is none
        [executable(), "container", "inspect", "--format", "{{json .State}}", name],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        return None
    state: dict[str, Any] = json.loads(done.stdout)
    return state


def logs_tail(name: str, lines: int) -> str:
    """The last ``lines`` lines the container wrote to stdout and stderr.

    Not ``podman logs --tail``: it counts each piece of a line conmon logged in parts as a line
    and then prints only the last piece (a line's bare newline, often).
    """
    done = podman(["logs", name])
    return "".join((done.stdout + done.stderr).splitlines(keepends=True)[-lines:])


def remove_containers(label: str, *, grace_s: int = 0) -> list[str]:
    """Force-remove every container carrying ``label`` (``key=value``); return their ids."""
    ids = podman(["ps", "--all", "--quiet", "--filter", f"label={label}"]).stdout.split()
    if ids:
        podman(["rm", "--force", "--time", str(grace_s), *ids], timeout_s=120 + grace_s)
    return ids
