"""Runtime pods run as real containers of the runtime image (the fake kubelet's container backend).

`make e2e-containers` builds the images first; without podman or the runtime image every test
fails at once with the command that makes them, rather than being skipped.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fleetserve_operator.render.pods import container_security_context

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.cluster import local_runtime_images
from fleetserve_e2e.container_pod import remove_cluster_containers
from fleetserve_e2e.images.base import BaseRecipe
from fleetserve_e2e.images.catalog import RUNTIME_GPU, image_tag
from fleetserve_e2e.images.containers import ContainerSpec, run_argv
from fleetserve_e2e.images.podman import image_exists, podman
from fleetserve_e2e.images.registry import PullOptions
from fleetserve_e2e.kubeapi import JsonObject, namespaced
from fleetserve_e2e.oci_registry import OciRegistry
from fleetserve_e2e.pod_containers import CLUSTER_LABEL, POD_UID_LABEL, container_name
from fleetserve_e2e.testing import RUNTIME_IMAGE, list_pods, wait_for_ready_pods
from fleetserve_e2e.waiting import wait_until

LOCAL_RUNTIME = image_tag(RUNTIME_GPU)
UID = 65532
MODEL_SOURCE = "s3://models/minilm-from-a-secret"
# The init container writes the runtime's config; the runtime reads the model from it.
WRITE_CONFIG = (
    "import pathlib; pathlib.Path('/config/runtime.yaml')"
    ".write_text('model: builtin://minilm-l6\\n')"
)
FAIL_IN_LOG = "import sys; print('fetch: the bucket is gone', file=sys.stderr); sys.exit(3)"
FAIL_WITH_MESSAGE = (
    "import pathlib, sys; pathlib.Path('/dev/termination-log')"
    '.write_text(\'{"reason": "NotFound", "message": "no such model"}\'); sys.exit(3)'
)


@pytest.fixture(scope="module", autouse=True)
def _images_built() -> None:
    if shutil.which("podman") is None or not image_exists(LOCAL_RUNTIME):
        pytest.fail(f"needs podman and {LOCAL_RUNTIME}: run `make images`", pytrace=False)


@pytest.fixture(scope="module")
def containers_cluster() -> Iterator[LocalCluster]:
    """A cluster whose fake kubelet runs runtime pods as containers of the local image."""
    with _cluster() as cluster:
        yield cluster


def _cluster(pull: PullOptions | None = None) -> LocalCluster:
    return LocalCluster(pod_backend="containers", pod_images=local_runtime_images(), pull=pull)


@pytest.fixture
def kube(containers_cluster: LocalCluster) -> KubeClient:
    """This module's cluster's admin client (the `namespace` fixture creates its namespace)."""
    return containers_cluster.client


def _pod_spec(
    init_script: str,
    *,
    memory: str,
    init_image: str = RUNTIME_IMAGE,
    init_messages: str = "File",
) -> JsonObject:
    """A runtime pod as the operator renders one, with an init container writing its config."""
    return {
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID},
        "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "config", "emptyDir": {}},
        ],
        "initContainers": [
            {
                "name": "write-config",
                "image": init_image,
                "command": ["python3", "-c", init_script],
                "volumeMounts": [{"name": "config", "mountPath": "/config"}],
                "securityContext": container_security_context(),
                "terminationMessagePolicy": init_messages,
            }
        ],
        "containers": [
            {
                "name": "runtime",
                "image": RUNTIME_IMAGE,
                "command": ["fleetserve-runtime", "serve"],
                "args": ["--config", "/config/runtime.yaml"],
                "env": [
                    {
                        "name": "FLEETSERVE_MODEL_SOURCE",
                        "valueFrom": {"secretKeyRef": {"name": "model", "key": "source"}},
                    }
                ],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}},
                "volumeMounts": [
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "config", "mountPath": "/config", "readOnly": True},
                ],
                "securityContext": container_security_context(),
                "resources": {"limits": {"memory": memory, "cpu": "1"}},
            }
        ],
    }


def _deploy(kube: KubeClient, namespace: str, name: str, spec: JsonObject) -> None:
    secret = {
        "metadata": {"name": "model"},
        "data": {"source": base64.b64encode(MODEL_SOURCE.encode()).decode()},
    }
    kube.create(namespaced("secrets", namespace), secret)
    labels = {"app.kubernetes.io/name": name}
    deployment = {
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }
    kube.create(namespaced("deployments", namespace, group_version="apps/v1"), deployment)


def _wait_for_restarts(
    kube: KubeClient, namespace: str, statuses: str, *, count: int
) -> JsonObject:
    """The namespace's pod once the first of its `statuses` has restarted `count` times."""

    def restarted() -> JsonObject | None:
        pods = list_pods(kube, namespace)
        found = pods[0]["status"].get(statuses) if pods else None
        return pods[0] if found and found[0]["restartCount"] >= count else None

    return wait_until(restarted, timeout_s=120, what=f"{statuses}[0] restarted {count} times")


def test_runtime_pod_runs_as_a_container_of_its_image(
    containers_cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    """Init container, Secret env, emptyDirs, securityContext: Ready, and MiniLM answers."""
    _deploy(kube, namespace, "minilm", _pod_spec(WRITE_CONFIG, memory="3Gi"))
    (pod,) = wait_for_ready_pods(kube, namespace, count=1, timeout_s=180)
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert init["state"]["terminated"]["reason"] == "Completed"

    (address,) = [p for p in containers_cluster.pod_addresses() if p.namespace == namespace]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a cat"]}]}
    response = httpx.post(f"{address.url}/v2/models/model/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    vector = np.array(response.json()["outputs"][0]["data"], dtype=np.float32)
    assert vector.shape == (384,), "not MiniLM: the config the init container wrote was unread"
    metadata = httpx.get(f"{address.url}/v2/models/model", timeout=10).text
    assert MODEL_SOURCE in metadata, "the Secret-sourced env var did not reach the runtime"

    name = container_name(pod, "runtime")
    config = podman(["inspect", "--format", "{{json .HostConfig}}|{{.Config.User}}", name]).stdout
    host_config, user = config.strip().rsplit("|", 1)
    assert user == f"{UID}:{UID}"
    for expected in ('"ReadonlyRootfs":true', '"Memory":3221225472', "no-new-privileges"):
        assert expected in host_config, expected
    labelled = podman(["ps", "--quiet", "--filter", f"label={POD_UID_LABEL}"]).stdout.split()
    assert labelled, "the pod's container carries no pod-uid label"


@pytest.mark.parametrize(
    ("script", "policy", "message"),
    [
        (FAIL_WITH_MESSAGE, "File", '{"reason": "NotFound", "message": "no such model"}'),
        (FAIL_IN_LOG, "FallbackToLogsOnError", "fetch: the bucket is gone\n"),
    ],
    ids=["file", "fallback-to-logs"],
)
def test_failing_init_container_keeps_the_pod_initializing(
    kube: KubeClient, namespace: str, script: str, policy: str, message: str
) -> None:
    """A failed init container is retried; its exit code and termination message are reported."""
    spec = _pod_spec(script, memory="3Gi", init_messages=policy)
    _deploy(kube, namespace, "badfetch", spec)
    pod = _wait_for_restarts(kube, namespace, "initContainerStatuses", count=1)
    assert pod["status"]["phase"] == "Pending"
    (init,) = pod["status"]["initContainerStatuses"]
    failed = init["lastState"]["terminated"]
    assert failed["exitCode"] == 3
    assert failed["reason"] == "Error"
    assert failed["message"] == message
    (runtime,) = pod["status"]["containerStatuses"]
    assert runtime["state"] == {"waiting": {"reason": "PodInitializing"}}


def test_container_over_its_memory_limit_is_reported_oom_killed(
    kube: KubeClient, namespace: str
) -> None:
    """200 MiB cannot hold MiniLM: exit 137 reported OOMKilled, after each restart too."""
    _deploy(kube, namespace, "tight", _pod_spec(WRITE_CONFIG, memory="200Mi"))

    pod = _wait_for_restarts(kube, namespace, "containerStatuses", count=2)
    ended = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert ended["exitCode"] == 137
    assert ended["reason"] == "OOMKilled"


def test_an_image_missing_locally_is_pulled_from_the_registry(
    oci_registry: OciRegistry, tmp_path: Path
) -> None:
    """The init container's image, only in the TLS registry behind a password, is pulled."""
    base = BaseRecipe().tag()
    assert image_exists(base), f"needs the base image {base}: run `make images`"
    pull = PullOptions.for_registry(oci_registry, tmp_path / "certs")
    ref = oci_registry.reference("fleetserve/init", tmp_path.name.lower())
    podman(["push", "--quiet", *pull.options(), base, f"docker://{ref}"], timeout_s=300)
    assert not image_exists(ref)
    try:
        with _cluster(pull) as cluster:
            kube = cluster.client
            kube.create("/api/v1/namespaces", {"metadata": {"name": "pulled"}})
            spec = _pod_spec(WRITE_CONFIG, memory="3Gi", init_image=ref)
            _deploy(kube, "pulled", "pulled", spec)
            pod = _wait_for_init(kube, "pulled")
        (init,) = pod["status"]["initContainerStatuses"]
        assert init["state"]["terminated"]["exitCode"] == 0
        assert image_exists(ref)
    finally:
        subprocess.run(["podman", "rmi", "--force", ref], capture_output=True, check=False)


def _wait_for_init(kube: KubeClient, namespace: str) -> JsonObject:
    """The namespace's pod once its first init container terminated."""

    def initialized() -> JsonObject | None:
        pods = list_pods(kube, namespace)
        found = pods[0]["status"].get("initContainerStatuses") if pods else None
        return pods[0] if found and "terminated" in found[0]["state"] else None

    return wait_until(initialized, timeout_s=180, what="the init container to terminate")


def test_a_killed_runs_leftover_containers_are_removed_by_the_cluster_label(
    tmp_path: Path,
) -> None:
    """What a killed test run left behind carries its cluster's label, and goes by it."""
    marker = str(tmp_path)
    spec = ContainerSpec(LOCAL_RUNTIME, labels={CLUSTER_LABEL: marker})
    podman(run_argv(spec, f"leftover-{tmp_path.name}", detach=True))
    labelled = ["ps", "--all", "--quiet", "--filter", f"label={CLUSTER_LABEL}={marker}"]
    assert podman(labelled).stdout.split()
    assert remove_cluster_containers(marker)
    assert podman(labelled).stdout.split() == []
