"""The chart installed from a registry's images, the operator and its services real containers.

The images are pushed to a registry (Distribution, TLS, a password) and the chart names them
there: the operator's image, the runtime's for the GPU tracks and, as the CPU-track image
cannot be built on these machines (torch's CPU wheel is served only by PyTorch's own index),
the same runtime image for the CPU fallback. The fake kubelet runs every pod of those images
as containers pulled from that registry, confined as the pod specs say. The operator's pod is
an in-cluster client, as on a cluster: the projected token of the chart's ServiceAccount (a
TokenRequest token bound to the pod), the cluster CA and namespace under
/var/run/secrets/kubernetes.io/serviceaccount, and ``KUBERNETES_SERVICE_HOST``/``PORT`` naming
the API server by a name in its certificate that resolves to the host's loopback in the
container (slirp4netns), where the API server listens on 127.0.0.1 only; so it reconciles with
the chart's RBAC and nothing more. Prometheus is reached the same way, by a name. MiniLM and
SmolLM2 answer from the image a cluster would run.

A third service, of the synthetic model (a MiniLM container takes minutes to start on two busy
cores, and a promotion starts two), then rolls out twice, every track a container: a new
version promoted step by step, and one failing half its requests, rolled back. Prometheus
scrapes the containers at their ports published on 127.0.0.1 (the fake kubelet's file_sd), the
load driver plays the gateway by the HTTPRoute's weights, and the operator's container judges
each step from Prometheus.
"""

from __future__ import annotations

import json
import time
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
from fleetserve_e2e.kubeapi import JsonObject, KubeClient
from fleetserve_e2e.loadgen import LoadDriver, track_weights
from fleetserve_e2e.oci_registry import OciRegistry
from fleetserve_e2e.operator_process import child_path, condition, fsvc_path
from fleetserve_e2e.operator_testing import synthetic_service
from fleetserve_e2e.pki import APISERVER_NAME
from fleetserve_e2e.pod_containers import POD_UID_LABEL
from fleetserve_e2e.pod_map import PodAddress
from fleetserve_e2e.rollout_testing import THRESHOLD_ONLY, failed_requests, synthetic_model
from fleetserve_e2e.testing import list_pods
from fleetserve_e2e.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fleetserve"
NAMESPACE = "fleet"
READY_TIMEOUT_S = 300.0
OPERATOR_SELECTOR = "app.kubernetes.io/name=fleetserve-operator"
PROMETHEUS_NAME = "prometheus"
"""How the operator's container names Prometheus (on the host's loopback)."""
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CANARIED = "demo"
"""The synthetic service that rolls out (`rollout_testing.synthetic_model`'s name)."""
ROLLOUT_STEPS = [50, 100]
"""Two canary steps: one judged at half the traffic, then the promotion."""
ROLLOUT_INTERVAL_S = 5
ROLLOUT_TICK_S = "1"
"""The operator's rollout timer, well inside a step (its default, 5 s, would double a step)."""
ROLLOUT_TIMEOUT_S = 180.0
"""A canary container starts (the runtime imports torch) before its first step."""
LOAD_RPS = 8.0
"""A canary at 50% sees ~20 requests a step."""
BAD_ERROR_RATE = 0.5

# helm install, three services whose pods import torch in containers, a streamed chat, two
# rollouts.
pytestmark = pytest.mark.timeout(900)


@dataclass(frozen=True)
class Fleet:
    """The installed release: its cluster, the registry references and the two services."""

    cluster: LocalCluster
    prometheus: LocalPrometheus
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
        LocalCluster(pod_backend="containers", pull=pull, host_names=(PROMETHEUS_NAME,)) as cluster,
        LocalPrometheus(cluster.file_sd_path, scrape_interval_s=1.0) as prometheus,
    ):
        prometheus_url = f"http://{PROMETHEUS_NAME}:{prometheus.port}"
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
            "--set-json", f'operator.allowedPrometheusUrls=["{prometheus_url}"]',
            "--set-json",
            f'operator.extraEnv=[{{"name":"FLEETSERVE_ROLLOUT_TICK_S","value":"{ROLLOUT_TICK_S}"}}]',
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        minilm = demo_service(prometheus_url=prometheus_url, interval_s=5)
        chat = chat_service(prometheus_url=prometheus_url)
        chat["spec"]["fallback"]["enabled"] = False
        services = (minilm, chat, _canaried_service(prometheus_url))
        for service in services:
            cluster.client.create(fsvc_path(NAMESPACE), service)
        fleet = Fleet(cluster, prometheus, operator_ref, runtime_ref)
        for service in services:
            name = service["metadata"]["name"]

            def ready(name: str = name) -> bool:
                status = fleet.kube.get(fsvc_path(NAMESPACE, name)).get("status", {})
                return bool(condition(status, "Ready")["status"] == "True")

            wait_until(ready, timeout_s=READY_TIMEOUT_S, what=f"{name} Ready", interval_s=1.0)
        yield fleet


def _canaried_service(prometheus_url: str) -> JsonObject:
    """The synthetic service, version 1: steps of `ROLLOUT_STEPS`, judged on 5 s of metrics."""
    analysis = {"mode": "threshold", "prometheusUrl": prometheus_url, "window": "5s",
                "minRequests": 5, "failureThreshold": 1, **THRESHOLD_ONLY}  # fmt: skip
    return synthetic_service(
        CANARIED,
        model=synthetic_model("1"),
        traffic={"provider": "gateway-api", "parentRefs": [{"name": "gateway"}]},
        rollout={
            "steps": ROLLOUT_STEPS,
            "interval": f"{ROLLOUT_INTERVAL_S}s",
            "progressDeadline": "3m",
            "analysis": analysis,
        },
    )


def _pod_container(uid: str) -> JsonObject:
    """``podman container inspect`` of the one container running for the pod `uid`."""
    names = podman(
        ["ps", "--filter", f"label={POD_UID_LABEL}={uid}", "--format", "{{.Names}}"]
    ).stdout.split()
    assert len(names) == 1, names
    inspected: JsonObject = json.loads(podman(["container", "inspect", names[0]]).stdout)[0]
    return inspected


def test_the_operator_runs_as_a_container_with_its_service_accounts_token_only(
    fleet: Fleet,
) -> None:
    """The operator's pod: the registry's image, confined, acting as the chart's account."""
    (pod,) = list_pods(fleet.kube, NAMESPACE, OPERATOR_SELECTOR)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == fleet.operator_ref
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"]
    assert ready == "True"
    inspected = _pod_container(pod["metadata"]["uid"])
    assert inspected["ImageName"] == fleet.operator_ref
    assert inspected["Config"]["User"] == "65532:65532"
    assert inspected["HostConfig"]["ReadonlyRootfs"] is True
    env = dict(item.split("=", 1) for item in inspected["Config"]["Env"])
    assert env["KUBERNETES_SERVICE_HOST"] == APISERVER_NAME
    assert "KUBECONFIG" not in env
    token = podman(["exec", inspected["Name"], "cat", TOKEN_PATH]).stdout
    review = fleet.kube.create(
        "/apis/authentication.k8s.io/v1/tokenreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
    )
    account = pod["spec"]["serviceAccountName"]
    assert review["status"]["user"]["username"] == f"system:serviceaccount:{NAMESPACE}:{account}"


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
    # The service is Ready on its stable track; the fallback's container loads its model
    # beside it, later on a machine whose page cache holds none of the image yet.
    wait_until(
        lambda: [pod.ready for pod in fleet.pods("minilm", "fallback")] == [True],
        timeout_s=READY_TIMEOUT_S,
        what="minilm's one fallback pod Ready",
        interval_s=1.0,
    )


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


def _status(fleet: Fleet) -> JsonObject:
    status: JsonObject = fleet.kube.get(fsvc_path(NAMESPACE, CANARIED)).get("status", {})
    return status


def _route_weights(fleet: Fleet) -> dict[str, int]:
    """The weighted tracks of the service's HTTPRoute (a track at weight 0 left out)."""
    route = fleet.kube.get(child_path("HTTPRoute", NAMESPACE, CANARIED))
    return {track: w for track, w in track_weights(route, CANARIED).items() if w}


def _scraped_tracks(fleet: Fleet) -> set[str]:
    """The tracks of the service whose containers Prometheus scrapes and finds up."""
    return {
        target["labels"]["track"]
        for target in fleet.prometheus.active_targets()
        if target["health"] == "up"
        and target["labels"].get("namespace") == NAMESPACE
        and target["labels"].get("app_instance") == CANARIED
        and "track" in target["labels"]
    }


def _roll_out(fleet: Fleet, model: dict[str, str], ended: str) -> tuple[JsonObject, LoadDriver]:
    """Roll `model` out under load until the rollout ends; the status and the load's record.

    `ended` is the phase the test expects; the wait stops at a rollout that ended otherwise
    too. On the way, Prometheus must scrape the canary's container beside the stable one's:
    the operator judges the steps on nothing else.
    """
    version = model["version"]
    scraped: set[str] = set()

    def over() -> JsonObject | None:
        scraped.update(_scraped_tracks(fleet))
        status = _status(fleet)
        promoted = status.get("phase") == "Succeeded" and status.get("stableVersion") == version
        return status if promoted or status.get("phase") in ("RolledBack", "Failed") else None

    with LoadDriver(
        fleet.cluster, NAMESPACE, CANARIED, CANARIED, rate_rps=LOAD_RPS,
        duration_s=ROLLOUT_TIMEOUT_S,
    ) as load:  # fmt: skip
        patched_at = time.monotonic()
        fleet.kube.merge_patch(fsvc_path(NAMESPACE, CANARIED), {"spec": {"model": model}})
        status = wait_until(over, timeout_s=ROLLOUT_TIMEOUT_S, what=f"version {version} {ended}")
        print(
            f"{CANARIED} v{version}: {status['phase']} {time.monotonic() - patched_at:.1f}s after "
            f"the patch; canary weights seen {[s.weights.get('canary') for s in load.routes]}; "
            f"{status.get('rollout', {}).get('message', '')}"
        )
        assert status["phase"] == ended, status.get("rollout")
        load.wait_canary_gone()
    assert {"stable", "canary"} <= scraped, scraped
    return status, load


def test_a_new_version_is_promoted_through_a_canary_container(fleet: Fleet) -> None:
    """Version 2, as good as 1: its canary container passes each step and is promoted."""
    status, load = _roll_out(fleet, synthetic_model("2"), "Succeeded")
    assert status["stableVersion"] == "2"
    assert condition(status, "Promoted")["status"] == "True"
    assert load.canary_steps() == ROLLOUT_STEPS, load.routes
    assert _route_weights(fleet) == {"stable": 100}
    passed = [a for a in status["rollout"]["analyses"] if a["verdict"] == "Passed"]
    assert len(passed) >= len(ROLLOUT_STEPS), status["rollout"]["analyses"]
    assert load.by_track("canary"), "no request reached the canary"
    failed = [r for r in load.records if r.status != 200]
    assert not failed, failed_requests(load)


def test_an_erroring_version_is_rolled_back_from_its_canary_container(fleet: Fleet) -> None:
    """A version failing half its requests: rolled back at its first step, stable unchanged."""
    stable_version = _status(fleet)["stableVersion"]
    version = str(int(stable_version) + 1)
    model = synthetic_model(version, error_rate=BAD_ERROR_RATE)
    status, load = _roll_out(fleet, model, "RolledBack")
    assert status["stableVersion"] == stable_version
    assert status.get("canaryWeight", 0) == 0
    assert "error-rate" in status["rollout"]["message"], status["rollout"]
    assert _route_weights(fleet) == {"stable": 100}
    assert [r for r in load.by_track("canary") if r.is_server_error], "the canary failed nothing"
    assert all(r.status == 200 for r in load.by_track("stable")), "stable answered errors"
    wait_until(
        lambda: not fleet.pods(CANARIED, "canary"), timeout_s=60.0, what="the canary pod to go"
    )
