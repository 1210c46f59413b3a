"""The Dockerfiles' build stages run with `sh`, as a build runs them, on recording stand-ins.

pip, python and the two entry points are stand-ins that record each call (the stage, the
program, its arguments and a copy of each `-r` file) and install nothing: `pip check` answers
with the report a test gives for that stage, and python names a folder of the test's as its
site-packages. awk, sed, grep, rm and the shell are the system's. Each instruction takes
effect in order: a COPY from the build context copies into the folder the steps run in (the
Dockerfiles' WORKDIR), an ARG is seen from its declaration to the end of its stage only, and
the build stops at the first RUN that fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from tests.images.dockerfile_stages import ROOT, Stage, is_copy_from_context, run_flags, stages

STAND_INS = ("pip", "python", "fleetserve-runtime", "fleetserve-operator")
_STAND_IN = """#!/bin/sh
call="$CALLS/$(ls "$CALLS" | wc -l)"
mkdir "$call"
printf '%s\\n' "$STAGE" "${0##*/}" "$@" > "$call/argv"
previous=
for arg in "$@"; do
  if [ "$previous" = -r ]; then cp "$arg" "$call/"; fi
  previous="$arg"
done
case "${0##*/} $1 $2" in
  "pip check "*) printf '%s' "$PIP_CHECK_REPORT"; [ -z "$PIP_CHECK_REPORT" ] || exit 1 ;;
  "python -c "*purelib*) printf '%s\\n' "$PURELIB" ;;
esac
"""


@dataclass(frozen=True)
class Call:
    """One recorded call: in which stage, of which program, with which arguments and files."""

    stage: str
    program: str
    args: list[str]
    files: dict[str, Path]


@dataclass(frozen=True)
class Build:
    """What the stages did: the exit status, the output, the calls and the site-packages."""

    returncode: int
    stdout: str
    stderr: str
    failed_stage: str | None
    calls: list[Call]
    site_packages: Path

    def pip(self) -> list[Call]:
        """The pip calls, in order."""
        return [call for call in self.calls if call.program == "pip"]


def _chain(dockerfile: Path, names: Iterable[str]) -> list[Stage]:
    """The named stages, each built on the one before it, the first on an image."""
    by_name = {s.name: s for s in stages(dockerfile)}
    chain = [by_name[name] for name in names]
    assert chain[0].base not in by_name, f"{chain[0].name} starts from a stage, not an image"
    for parent, child in pairwise(chain):
        assert child.base == parent.name, f"{child.name} is not built on {parent.name}"
    return chain


def _copy_from_context(value: str, workdir: Path) -> None:
    """COPY <sources...> <destination> from the repository into the build's WORKDIR."""
    *sources, destination = value.split()
    target = workdir / destination
    for source in sources:
        if (ROOT / source).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
            shutil.copytree(ROOT / source, target, dirs_exist_ok=True, ignore=ignore)
        else:
            assert destination.endswith("/"), f"COPY {source}: copy files into a folder"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / source, target)


def _recorded(calls: Path) -> list[Call]:
    recorded = []
    for call in sorted(calls.iterdir(), key=lambda p: int(p.name)):
        stage_name, program, *args = (call / "argv").read_text().splitlines()
        files = {p.name: p for p in call.iterdir() if p.name != "argv"}
        recorded.append(Call(stage_name, program, args, files))
    return recorded


@dataclass(frozen=True)
class _Sandbox:
    """The folders a build runs in: stand-ins, their records, the WORKDIR, site-packages."""

    bin_dir: Path
    calls: Path
    workdir: Path
    site_packages: Path

    @classmethod
    def make(cls, tmp_path: Path, site_files: Iterable[str]) -> _Sandbox:
        sandbox = cls(tmp_path / "bin", tmp_path / "calls", tmp_path / "src", tmp_path / "site")
        for folder in (sandbox.bin_dir, sandbox.calls, sandbox.workdir, sandbox.site_packages):
            folder.mkdir()
        for name in STAND_INS:
            (sandbox.bin_dir / name).write_text(_STAND_IN)
            (sandbox.bin_dir / name).chmod(0o755)
        for relative in site_files:
            (sandbox.site_packages / relative).parent.mkdir(parents=True, exist_ok=True)
            (sandbox.site_packages / relative).touch()
        return sandbox


def _run_stage(
    build_stage: Stage, env: dict[str, str], build_args: Mapping[str, str], sandbox: _Sandbox
) -> Iterator[subprocess.CompletedProcess[str]]:
    """Each RUN of the stage as it runs, after the ARGs and COPYs before it took effect."""
    for item in build_stage.instructions:
        if item.keyword == "ARG":
            name, has_default, default = item.value.partition("=")
            if name in build_args or has_default:
                env[name] = build_args.get(name, default.strip('"'))
        elif item.keyword == "COPY":
            assert is_copy_from_context(item.value), f"COPY {item.value}: not run here"
            _copy_from_context(item.value, sandbox.workdir)
        elif item.keyword == "RUN":
            yield subprocess.run(  # the Dockerfile's own step, on the stand-ins
                ["/bin/sh", "-c", run_flags(item.value)[1]],
                cwd=sandbox.workdir, env=env, capture_output=True, text=True, timeout=60,
                check=False,
            )  # fmt: skip


def run_stages(
    dockerfile: Path,
    names: Iterable[str],
    tmp_path: Path,
    *,
    build_args: Mapping[str, str] | None = None,
    pip_check: Mapping[str, str] | None = None,
    site_files: Iterable[str] = (),
) -> Build:
    """Run the named stages' instructions in order; `pip_check` is each stage's report.

    `site_files` are made (empty) in the stand-in site-packages first, as if installed.
    """
    sandbox = _Sandbox.make(tmp_path, site_files)
    stdout, stderr = [], []
    for build_stage in _chain(dockerfile, names):
        assert build_stage.name is not None
        env = {
            # Only the system's tools besides the stand-ins: nothing reaches a real pip.
            "PATH": f"{sandbox.bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
            "CALLS": str(sandbox.calls),
            "STAGE": build_stage.name,
            "PURELIB": str(sandbox.site_packages),
            "PIP_CHECK_REPORT": (pip_check or {}).get(build_stage.name, ""),
        }
        for proc in _run_stage(build_stage, env, build_args or {}, sandbox):
            stdout.append(proc.stdout)
            stderr.append(proc.stderr)
            if proc.returncode != 0:
                return Build(
                    proc.returncode, "".join(stdout), "".join(stderr), build_stage.name,
                    _recorded(sandbox.calls), sandbox.site_packages,
                )  # fmt: skip
    return Build(
        0, "".join(stdout), "".join(stderr), None, _recorded(sandbox.calls), sandbox.site_packages
    )
