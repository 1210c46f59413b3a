"""The generated CRD against a real API server.

It installs, accepts the examples, rejects each invalid object with a message naming the field,
bounds every string and quantity, and `kubectl get fsvc` shows the printer columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetserve_e2e import KubeApiError, KubeClient, LocalCluster
from fleetserve_e2e.operator_process import fsvc_path
from fleetserve_e2e.operator_testing import synthetic_service

ROOT = Path(__file__).resolve().parents[2]
# examples/models/ name stores only a real cluster has; they are checked, not run.
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml")) + sorted(
    (ROOT / "examples" / "models").glob("*.yaml")
)
INVALID = sorted((ROOT / "tests" / "operator" / "invalid").glob("*.yaml"))


MIB = 2**20
GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gateway"}]}
MODEL = {"name": "m", "version": "1", "uri": "builtin://synthetic"}


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
    """`kubectl get fsvc` prints the rollout's columns; `-o wide` adds source, digest, metadata."""
    created = crd.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples/synthetic.yaml"))
    assert created.returncode == 0, created.stderr
    listed = crd.kubectl("get", "fsvc", "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    header = listed.stdout.splitlines()[0].split()
    assert header == ["NAME", "MODEL", "STABLE", "CANARY", "WEIGHT", "PHASE", "READY", "AGE"]
    assert listed.stdout.splitlines()[1].split()[:2] == ["synthetic", "synthetic"]
    wide = crd.kubectl("get", "fsvc", "-n", namespace, "-o", "wide")
    assert wide.returncode == 0, wide.stderr
    assert wide.stdout.splitlines()[0].split()[-3:] == ["SOURCE", "DIGEST", "METADATA"]


# Each value reached the operator before the schema bounded it: a quantity the operator could
# not compute with, or a string no child object can carry.
UNBOUNDED = [
    pytest.param("spec.memory.budget", {"memory": {"budget": "1e99999"}}, id="budget-exponent"),
    pytest.param("spec.memory.budget", {"memory": {"budget": "1" * 65}}, id="budget-length"),
    pytest.param("spec.memory.budget", {"memory": {"budget": -1}}, id="budget-negative"),
    pytest.param("spec.runtime.resources.requests",
                 {"runtime": {"resources": {"requests": {"memory": "1e99999"}}}},
                 id="request-exponent"),
    pytest.param("spec.runtime.resources.requests",
                 {"runtime": {"resources": {"requests": {"x" * 400: "1"}}}}, id="resource-name"),
    pytest.param("spec.model.uri", {"model": {**MODEL, "uri": "builtin://synthetic?" + "x" * MIB}},
                 id="uri-1MiB"),
    pytest.param("spec.model.version", {"model": {**MODEL, "version": "1.0+build"}},
                 id="version-not-a-label-value"),
    pytest.param("spec.runtime.env[0].value",
                 {"runtime": {"env": [{"name": "BLOB", "value": "x" * MIB}]}}, id="env-1MiB"),
    pytest.param("spec.traffic.hostnames[0]", {"traffic": {**GATEWAY, "hostnames": ["a" * MIB]}},
                 id="hostname-1MiB"),
    pytest.param("spec.traffic.hostnames[0]", {"traffic": {**GATEWAY, "hostnames": ["A_b"]}},
                 id="hostname-not-dns"),
    pytest.param("spec.runtime.nodeSelector", {"runtime": {"nodeSelector": {"pool": "x" * MIB}}},
                 id="label-value-1MiB"),
    pytest.param("spec.runtime.nodeSelector", {"runtime": {"nodeSelector": {"k" * MIB: "v"}}},
                 id="label-key-1MiB"),
    pytest.param("spec.runtime.serviceAccountName",
                 {"runtime": {"serviceAccountName": "Not_A_Name"}}, id="service-account"),
    pytest.param("spec.rollout.interval", {"rollout": {"interval": "9" * 30 + "h"}},
                 id="interval-digits"),
    pytest.param("spec.batching.buckets", {"batching": {"buckets": "1" + "0" * 5000}},
                 id="buckets-length"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "sections"), UNBOUNDED)
def test_unbounded_values_are_refused_naming_the_field(
    crd: LocalCluster, kube: KubeClient, namespace: str, field: str, sections: dict[str, Any]
) -> None:
    """The API server refuses each one (422), and its message names the field."""
    manifest = synthetic_service("bounded", **sections)
    with pytest.raises(KubeApiError) as refused:
        kube.request("POST", fsvc_path(namespace), body=manifest, params={"dryRun": "All"})
    assert refused.value.status_code == 422
    assert field in refused.value.message, refused.value.message[:2000]
