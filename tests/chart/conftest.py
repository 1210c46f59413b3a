"""Fixtures of the chart tests: the chart linted and rendered by the helm `make tools` builds.

`helm`, `render`, `only` and `operator_config` are fixtures because test modules cannot import
each other under `--import-mode=importlib`, and several chart test modules need them. A test
that asks for `helm` or `render` is skipped while helm is not built.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from fleetserve_operator.controller.settings import OperatorConfig
from tests.chart.fixture_types import Helm, Manifest, Only, ReadConfig, Render

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fleetserve"
# The helm binary's built-in Kubernetes version is v1.20 (it is built without release ldflags),
# older than the chart's kubeVersion; render for the version the e2e control plane runs.
KUBE_VERSION = re.search(
    r"k8s\.io/kubernetes (v\S+)", (ROOT / "e2e" / "tools" / "go.mod").read_text()
)[1]  # type: ignore[index]  # the pin is always there


def helm_path() -> Path:
    """The built helm (`$FLEETSERVE_HELM` overrides it), as `make tools` lays it out."""
    if override := os.environ.get("FLEETSERVE_HELM"):
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "fleetserve" / "bin" / KUBE_VERSION / "helm"


@pytest.fixture
def helm() -> Helm:
    """`helm(command, *args, check=True)`: helm `command` on the chart, for KUBE_VERSION.

    `args` are the command's own (a release name, `--set` values); a failure fails the test
    unless `check` is false. Returns the finished process.
    """
    binary = helm_path()
    if not binary.is_file():
        pytest.skip(f"{binary} is not built: run `make tools`")

    def run(command: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(binary), command, *args, str(CHART), "--kube-version", KUBE_VERSION]
        proc = subprocess.run(  # our own binary and arguments
            argv, capture_output=True, text=True, timeout=60, check=False
        )
        if check and proc.returncode:
            pytest.fail(f"helm {' '.join(argv[1:])} failed:\n{proc.stderr}")
        return proc

    return run


@pytest.fixture
def render(helm: Helm) -> Render:
    """`render(*values, namespace=...)`: `helm template` the chart (with its CRDs), parsed."""

    def template(*values: str, namespace: str = "fleetserve-system") -> list[Manifest]:
        out = helm("template", "fs", "-n", namespace, "--include-crds", *values).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]

    return template


def _only(manifests: Sequence[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


@pytest.fixture
def only() -> Only:
    """`only(manifests, kind, name=None)`: the one object of `kind` (and `name`, when given)."""
    return _only


@pytest.fixture
def operator_config(monkeypatch: pytest.MonkeyPatch) -> ReadConfig:
    """`operator_config(container, downward=None)`: what the operator container starts with.

    The container's env is set as the kubelet would set it, then read back by `OperatorConfig`
    as the operator does at start-up: literal values as they are; a downward-API variable to
    its field's value in `downward` (fieldPath -> value), or left unset without `downward`.
    """

    def read(container: Manifest, downward: Mapping[str, str] | None = None) -> OperatorConfig:
        for variable in container["env"]:
            if "value" in variable:
                monkeypatch.setenv(variable["name"], variable["value"])
            elif downward is not None:
                field = variable["valueFrom"]["fieldRef"]["fieldPath"]
                monkeypatch.setenv(variable["name"], downward[field])
        return OperatorConfig()

    return read
