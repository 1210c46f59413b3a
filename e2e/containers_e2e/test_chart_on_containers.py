"""The chart installed from a registry's images, its services served by real containers.

The images are pushed to a registry (Distribution, TLS, a password) and the chart names them
there: the operator's image, the runtime's for the GPU tracks and, as the CPU-track image
cannot be built on these machines (torch's CPU wheel is served only by PyTorch's own index),
the same runtime image for the CPU fallback. The fake kubelet runs the runtime pods as
containers pulled from that registry (the operator's pods stay processes: they need the API
server on the host's loopback), so MiniLM and SmolLM2 answer from the image a cluster would
run, confined as the operator's pod spec says.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from fleetserve_operator.naming import INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGER, TRACK_LABEL

from fleetserve_demo.manifest import chat_service, demo_service
from fleetserve_e2e import LocalCluster, LocalPrometheus
from fleetserve_e2e.chat import stream_chat
from fleetserve_e2e.helm import helm
from fleetserve_e2e.images.build import Built
from fleetserve_e2e.images.catalog import OPERATOR, RUNTIME_GPU
from fleetserve_e2e.images.podman import podman
from fleetserve_e2e.images.registry import PullOptions, push, remote_reference
from fleetserve_e2e.kubeapi import KubeClient
from fleetserve_e2e.oci_registry import OciRegistry
from fleetserve_e2e.operator_process import condition, fsvc_path
from fleetserve_e2e.pod_containers import POD_UID_LABEL
from fleetserve_e2e.pod_map import PodAddress
from fleetserve_e2e.testing import list_pods
from fleetserve_e2e.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fleetserve"
NAMESPACE = "fleet"
READY_TIMEOUT_S = 300.0

# helm install, two services whose pods import torch in containers, a streamed chat.
pytestmark = pytest.mark.timeout(900)


@dataclass(frozen=True)
class Fleet:
    """The installed release: its cluster, the registry references and the two services."""

    cluster: LocalCluster
    operator_ref: str
    runtime_ref: str

    @property
    def kube(self) -> KubeClient:
        """The cluster's admin client."""
        return self.cluster.client

    def pods(self, service: str, track: str) -> list[PodAddress]:
        """The published runtime pods of one track of a service."""
        return [
            p
            for p in self.cluster.pod_addresses()
            if p.namespace == NAMESPACE
            and p.labels.get(INSTANCE_LABEL) == service
            and p.labels.get(TRACK_LABEL) == track
        ]


def _repository(reference: str) -> str:
    return reference.rsplit(":", 1)[0]


@pytest.fixture(scope="module")
def fleet(
    images: dict[str, Built], image_registry: OciRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """The chart from the registry's images, with a MiniLM and a SmolLM2 service Ready."""
    for name in (OPERATOR, RUNTIME_GPU):
        push(images[name].spec.tag, image_registry)
    operator_ref = remote_reference(image_registry, images[OPERATOR].spec.tag)
    runtime_ref = remote_reference(image_registry, images[RUNTIME_GPU].spec.tag)
    work = tmp_path_factory.mktemp("fleet")
    pull = PullOptions.for_registry(image_registry, work / "certs")
    with (
        LocalCluster(pod_backend="containers", pull=pull) as cluster,
        LocalPrometheus(cluster.file_sd_path, scrape_interval_s=1.0) as prometheus,
    ):
        cluster.client.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        installed = helm(
            cluster, work, "install", "fs", str(CHART), "-n", NAMESPACE, "--wait",
            "--timeout", "150s",
            "--set", f"watchNamespaces[0]={NAMESPACE}",
            "--set", "replicas=1", "--set", "leaderElection.enabled=false",
            "--set", f"image.repository={_repository(operator_ref)}",
            "--set", f"runtime.image.repository={_repository(runtime_ref)}",
            "--set", f"runtime.cpuImage.repository={_repository(runtime_ref)}",
            "--set-string", f"runtime.cpuImage.tag={runtime_ref.rsplit(':', 1)[1]}",
            "--set-json", f'operator.allowedPrometheusUrls=["{prometheus.url}"]',
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        minilm = demo_service(prometheus_url=prometheus.url, interval_s=5)
        chat = chat_service(prometheus_url=prometheus.url)
        chat["spec"]["fallback"]["enabled"] = False
        for service in (minilm, chat):
            cluster.client.create(fsvc_path(NAMESPACE), service)
        fleet = Fleet(cluster, operator_ref, runtime_ref)
        for service in (minilm, chat):
            name = service["metadata"]["name"]

            def ready(name: str = name) -> bool:
                status = fleet.kube.get(fsvc_path(NAMESPACE, name)).get("status", {})
                return bool(condition(status, "Ready")["status"] == "True")

            wait_until(ready, timeout_s=READY_TIMEOUT_S, what=f"{name} Ready", interval_s=1.0)
        yield fleet


def test_runtime_pods_are_containers_of_the_registry_image(fleet: Fleet) -> None:
    """Every runtime pod names the registry's image and runs as a container of it."""
    pods = list_pods(fleet.kube, NAMESPACE, f"{MANAGED_BY_LABEL}={MANAGER}")
    assert len(pods) >= 3, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "runtime"]
        assert container["image"] == fleet.runtime_ref
        uid = pod["metadata"]["uid"]
        running = podman(
            ["ps", "--filter", f"label={POD_UID_LABEL}={uid}", "--format", "{{.Image}}"]
        ).stdout.split()
        assert running == [fleet.runtime_ref], pod["metadata"]["name"]


def test_minilm_answers_from_its_container(fleet: Fleet) -> None:
    """The stable track's container embeds; the CPU fallback's container runs too."""
    (stable,) = fleet.pods("minilm", "stable")
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                        "data": ["a cat sleeps", "a kitten naps"]}]}  # fmt: skip
    response = httpx.post(f"http://{stable.address}/v2/models/minilm/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    vectors = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    assert vectors.shape == (2, 384)
    assert float(vectors[0] @ vectors[1]) > 0.5
    (fallback,) = fleet.pods("minilm", "fallback")
    assert fallback.ready


def test_smollm2_streams_a_chat_from_its_container(fleet: Fleet) -> None:
    """A streamed answer, through the OpenAI client, from the stable track's container."""
    (stable,) = fleet.pods("smollm2", "stable")
    deltas: list[str] = []
    answer = stream_chat(
        f"http://{stable.address}",
        "smollm2",
        "What is the capital of France?",
        max_tokens=16,
        on_delta=deltas.append,
    )
    assert "Paris" in answer.text
    assert len(deltas) > 1
