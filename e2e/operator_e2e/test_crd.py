"""The generated CRD against a real API server.

It installs, accepts the examples, rejects each invalid object with a message naming the field,
and `kubectl get fsvc` shows the printer columns.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve_e2e import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "operator" / "invalid").glob("*.yaml"))


def _header(path: Path, key: str) -> str:
    prefix = f"# {key}: "
    line = next(line for line in path.read_text().splitlines() if line.startswith(prefix))
    return line.removeprefix(prefix)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_are_accepted(crd: LocalCluster, namespace: str, path: Path) -> None:
    """Each example passes the API server's schema and CEL validation."""
    result = crd.kubectl("apply", "-n", namespace, "--dry-run=server", "-f", str(path))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_objects_are_rejected(crd: LocalCluster, namespace: str, path: Path) -> None:
    """Each invalid object is refused with a message naming the field."""
    result = crd.kubectl("apply", "-n", namespace, "--dry-run=server", "-f", str(path))
    assert result.returncode != 0
    assert _header(path, "message") in result.stderr, result.stderr


def test_printer_columns(crd: LocalCluster, namespace: str) -> None:
    """`kubectl get fsvc` prints Model, Stable, Canary, Weight, Phase, Ready, Age."""
    created = crd.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples/synthetic.yaml"))
    assert created.returncode == 0, created.stderr
    listed = crd.kubectl("get", "fsvc", "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    header = listed.stdout.splitlines()[0].split()
    assert header == ["NAME", "MODEL", "STABLE", "CANARY", "WEIGHT", "PHASE", "READY", "AGE"]
    assert listed.stdout.splitlines()[1].split()[:2] == ["synthetic", "synthetic"]
