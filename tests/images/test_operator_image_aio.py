"""The operator image leaves out kubernetes/aio, which the operator never imports.

The kubernetes wheel carries an asyncio copy of its generated client (kubernetes/aio, a third
of the operator image). Dockerfile.operator's `deps` stage removes that folder, and only it,
right after installing the lock; the operator works without it only while none of its modules
imports it, which a fresh interpreter checks here by importing every one of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from tests.images.dockerfile_stages import ROOT, instructions, shell_commands, stage
from tests.images.stage_runner import run_stages

DOCKERFILE = ROOT / "Dockerfile.operator"
AIO = "kubernetes/aio/"
_IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys
import fleetserve_operator

def fail(name):
    raise ImportError(f"cannot walk {name}")

walked = pkgutil.walk_packages(
    fleetserve_operator.__path__, "fleetserve_operator.", onerror=fail
)
names = [module.name for module in walked]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


def test_the_operator_never_imports_kubernetes_aio() -> None:
    """Every module of fleetserve_operator imports, in a fresh interpreter, without it."""
    done = subprocess.run(  # our own package, in the venv's interpreter
        [sys.executable, "-c", _IMPORT_EVERY_MODULE],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result = json.loads(done.stdout.splitlines()[-1])
    imported, loaded = set(result["imported"]), set(result["loaded"])
    # The walk reached the entry point and the code that talks to the API server.
    assert {"fleetserve_operator.__main__", "fleetserve_operator.controller.kube"} <= imported
    assert "kubernetes.client" in loaded
    aio = sorted(m for m in loaded if m == "kubernetes.aio" or m.startswith("kubernetes.aio."))
    assert not aio, f"importing the operator loads {aio}, which its image leaves out"


def test_the_operator_image_removes_exactly_kubernetes_aio(tmp_path: Path) -> None:
    """One `rm`, in the `deps` RUN that installs the lock, takes kubernetes/aio and no more.

    It runs on the files of the installed kubernetes wheel (the venv holds the lock's version).
    """
    removals = [
        command
        for run in instructions(DOCKERFILE, "RUN")
        for command in shell_commands(run)
        if command.startswith("rm ")
    ]
    assert removals == ['rm -r "$site/kubernetes/aio"']
    (install,) = [run for run in stage(DOCKERFILE, "deps").values("RUN") if "rm " in run]
    assert "-r requirements/operator.lock" in install
    wheel = sorted(str(file) for file in metadata.files("kubernetes") or [])
    assert [file for file in wheel if file.startswith(AIO)], "the wheel has no kubernetes/aio"

    build = run_stages(DOCKERFILE, ("deps",), tmp_path, site_files=wheel)
    assert build.returncode == 0, build.stderr
    left = sorted(
        str(file.relative_to(build.site_packages))
        for file in build.site_packages.rglob("*")
        if file.is_file()
    )
    kept = [file for file in wheel if not file.startswith(AIO)]
    assert left == sorted([*kept, "fleetserve-app.pth"])
