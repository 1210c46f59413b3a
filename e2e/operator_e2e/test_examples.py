"""Each `examples/*.yaml`, applied as it is, runs: children, Ready runtime pods, truthful status.

The children are checked field by field against the example itself, and their set against
the documented names; that the API server's defaults cause no drift shows in test_restart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.operator_process import (
    GROUP_VERSION,
    KIND,
    MANAGER,
    MODEL_VERSION_LABEL,
    POOL_LABEL,
    TRACK_LABEL,
    OperatorProcess,
    condition,
    fsvc_path,
)
from fleetserve_e2e.operator_testing import children, flag, process_args, wait_converged
from fleetserve_e2e.testing import wait_for_ready_pods

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _prometheus_urls() -> list[str]:
    """The Prometheus URLs the examples name: the operator must be allowed to query them."""
    specs = [yaml.safe_load(path.read_text())["spec"] for path in EXAMPLES]
    analyses = [spec.get("rollout", {}).get("analysis") or {} for spec in specs]
    return sorted({a["prometheusUrl"] for a in analyses if "prometheusUrl" in a})


@pytest.fixture
def example_operator(start_operator: Callable[..., OperatorProcess]) -> OperatorProcess:
    """An operator allowed to query the Prometheus URLs the examples name."""
    allowed = json.dumps(_prometheus_urls())
    return start_operator({"FLEETSERVE_ALLOWED_PROMETHEUS_URLS": allowed})


def _tracks(spec: dict[str, Any]) -> dict[str, int]:
    """Ready replicas each track should reach: stable's and, when enabled, fallback's min."""
    wanted = {"stable": spec["runtime"]["replicas"]["min"]}
    fallback = spec.get("fallback", {})
    if fallback.get("enabled"):
        wanted["fallback"] = fallback["replicas"]["min"]
    return wanted


def _expected_children(spec: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """(kind, name) of every child: a Deployment and Service per track, umbrella, route."""
    expected = [("Service", name)]
    for track in _tracks(spec):
        expected += [("Deployment", f"{name}-{track}"), ("Service", f"{name}-{track}")]
    if spec["traffic"]["provider"] == "gateway-api":
        expected.append(("HTTPRoute", name))
    return expected


def _check_deployment(deployment: dict[str, Any], spec: dict[str, Any], track: str) -> None:
    """The Deployment runs the runtime with the example's model, batching and placement."""
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    batching = spec["batching"]
    if track == "fallback":
        batching = {**batching, **spec["fallback"].get("batching", {})}
    assert flag(args, "model") == spec["model"]["uri"]
    assert flag(args, "version") == spec["model"]["version"]
    assert flag(args, "track") == track
    assert flag(args, "max-batch-size") == str(batching["maxBatchSize"])
    assert container["command"] == ["fleetserve-runtime", "serve"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    labels = deployment["metadata"]["labels"]
    assert labels[TRACK_LABEL] == track
    assert labels[MODEL_VERSION_LABEL] == spec["model"]["version"]
    if track == "stable":
        requests = spec["runtime"].get("resources", {}).get("requests", {})
        assert container["resources"]["requests"] == {k: str(v) for k, v in requests.items()}
        assert pod.get("nodeSelector", {}) == spec["runtime"].get("nodeSelector", {})
    else:
        assert flag(args, "device") == "cpu"
        assert "nvidia.com/gpu" not in container["resources"].get("requests", {})


def _check_route(route: dict[str, Any], spec: dict[str, Any], name: str) -> None:
    """All traffic to stable; the fallback listed at weight 0; the example's parents, hosts."""
    traffic = spec["traffic"]
    assert route["spec"]["parentRefs"][0]["name"] == traffic["parentRefs"][0]["name"]
    assert route["spec"]["hostnames"] == traffic["hostnames"]
    weights = {ref["name"]: ref["weight"] for ref in route["spec"]["rules"][0]["backendRefs"]}
    assert weights == {f"{name}-stable": 100, f"{name}-fallback": 0}


def _check_status(body: dict[str, Any], tracks: dict[str, int]) -> None:
    status = body["status"]
    spec = body["spec"]
    assert status["phase"] == "Succeeded"
    assert status["observedGeneration"] == body["metadata"]["generation"]
    assert status["stableVersion"] == spec["model"]["version"]
    assert status["ready"] == f"{tracks['stable']}/{tracks['stable']}"
    for track, count in tracks.items():
        assert status["tracks"][track]["readyReplicas"] == count
    assert (condition(status, "Ready")["status"], condition(status, "Ready")["reason"]) == (
        "True",
        "Succeeded",
    )
    for kind in ("Progressing", "Degraded", "FallbackActive"):
        assert condition(status, kind)["status"] == "False"
        assert condition(status, kind)["observedGeneration"] == body["metadata"]["generation"]


def _check_pods(cluster: LocalCluster, kube: KubeClient, namespace: str, count: int) -> None:
    """Each pod runs a real runtime process whose command line is its container's args."""
    pods = wait_for_ready_pods(kube, namespace, count=count, timeout_s=60.0)
    processes = {p.pod: p for p in cluster.pod_addresses() if p.namespace == namespace}
    for pod in pods:
        process = processes[pod["metadata"]["name"]]
        assert process.ready
        args = pod["spec"]["containers"][0]["args"]
        # The harness rewrites --host/--port to a free loopback port; the rest is verbatim.
        running = process_args(process.pid)
        assert flag(running, "max-batch-size") == flag(args, "max-batch-size")
        assert flag(running, "track") == flag(args, "track")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(
    crd: LocalCluster,
    kube: KubeClient,
    namespace: str,
    example_operator: OperatorProcess,
    path: Path,
) -> None:
    """Children with the exact fields, Ready runtime pods, status and printer columns."""
    manifest = yaml.safe_load(path.read_text())
    name = manifest["metadata"]["name"]
    kube.create(fsvc_path(namespace), manifest)
    tracks = _tracks(manifest["spec"])
    body = wait_converged(kube, namespace, name, ready=tracks, timeout_s=240.0)
    _check_status(body, tracks)

    found = children(kube, namespace, name)
    assert sorted(found) == sorted(_expected_children(manifest["spec"], name))
    owner = {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "name": name,
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for child in found.values():
        assert child["metadata"]["ownerReferences"] == [owner]
        managers = {m["manager"] for m in child["metadata"]["managedFields"]}
        assert MANAGER in managers
    for track in tracks:
        _check_deployment(found[("Deployment", f"{name}-{track}")], manifest["spec"], track)
    if manifest["spec"]["traffic"]["provider"] == "gateway-api":
        _check_route(found[("HTTPRoute", name)], manifest["spec"], name)
    umbrella = found[("Service", name)]["spec"]
    assert umbrella["selector"][POOL_LABEL] == "gpu"

    _check_pods(crd, kube, namespace, sum(tracks.values()))
    events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    # A reconcile's "Created" notes may be joined into one Event, "; " between them.
    created = {
        part
        for e in events
        if e["involvedObject"]["name"] == name
        for part in e["message"].split("; ")
    }
    assert {f"Created {kind} {child}" for kind, child in found} <= created
    row = crd.kubectl("get", "fsvc", name, "-n", namespace, "--no-headers").stdout.split()
    version = manifest["spec"]["model"]["version"]
    assert row[:6] == [
        name,
        manifest["spec"]["model"]["name"],
        version,
        "0",
        "Succeeded",
        body["status"]["ready"],
    ]
    assert example_operator.total("fleetserve_operator_errors") == 0
