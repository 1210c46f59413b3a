"""The runtime image serves the built-in models as a restricted pod runs it."""

from __future__ import annotations

import httpx
import numpy as np
from fleetserve_operator.contract import HTTP_PORT as RUNTIME_PORT

from fleetserve_e2e.chat import stream_chat
from fleetserve_e2e.images.containers import Container
from fleetserve_e2e.images.podman import podman

# podman itself creates these in every container (the mount points of /etc/hosts,
# /etc/hostname, /etc/resolv.conf and its own /run/.containerenv): not the program's writes.
ENGINE_MOUNT_POINTS = {"/etc", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run",
                       "/run/.containerenv"}  # fmt: skip


def embed(container: Container, texts: list[str]) -> np.ndarray:
    """The embeddings of ``texts``, asked over the Open Inference Protocol's JSON."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    url = f"{container.url(RUNTIME_PORT)}/v2/models/model/infer"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def test_minilm_embeds_from_the_image(minilm: Container) -> None:
    """384-d unit vectors, and near meanings nearer than far ones."""
    cat, kitten, market = embed(minilm, ["a cat sleeps", "a kitten naps", "stock prices fell"])
    for vector in (cat, kitten, market):
        assert vector.shape == (384,)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-4
    assert float(cat @ kitten) > float(cat @ market) + 0.2


def test_the_runtime_writes_nothing_outside_its_mounts(minilm: Container) -> None:
    """After loading (and exporting the ONNX graph to /tmp) and answering: no file changed."""
    embed(minilm, ["one more request"])
    assert set(minilm.changed_paths()) <= ENGINE_MOUNT_POINTS


def test_the_image_healthcheck_passes_on_a_ready_runtime(minilm: Container) -> None:
    """The HEALTHCHECK the image declares (kept: the image is built in Docker's format)."""
    assert minilm.healthy()


def test_the_container_is_held_to_its_memory_limit(minilm: Container) -> None:
    """The cgroup the container runs in has the limit a pod's resources.limits.memory sets."""
    done = podman(["inspect", "--format", "{{.HostConfig.Memory}}", minilm.name])
    assert int(done.stdout.strip()) == 3 * 1024**3


def test_smollm2_streams_a_chat_answer_from_the_image(smollm2: Container) -> None:
    """The OpenAI client streams a right answer from the generative engine in the image."""
    deltas: list[str] = []
    answer = stream_chat(
        smollm2.url(RUNTIME_PORT),
        "model",
        "What is the capital of France?",
        max_tokens=16,
        on_delta=deltas.append,
    )
    assert "Paris" in answer.text
    assert len(deltas) > 1, "the answer came in one piece, not streamed"
