"""A generative InferenceService on the local control plane: its rules, its route, a chat stream.

The API server holds the SmolLM2 KV-cache rule to the same byte as the operator; SmolLM2
(`builtin://smollm2-135m`, its task known from the URI) becomes Ready with the engine's
flags on its runtime process, its HTTPRoute forwards only the generation paths of that
model, and a chat answer streams from the pod's address through the official `openai`
client. (The invalid objects of tests/operator/invalid/, generation rules among them, are
refused in test_crd.)
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_e2e import KubeApiError, KubeClient, LocalCluster
from fleetserve_e2e.chat import stream_chat
from fleetserve_e2e.operator_process import (
    GROUP_VERSION,
    KIND,
    OperatorProcess,
    condition,
    fsvc_path,
)
from fleetserve_e2e.operator_testing import (
    children,
    flag,
    process_args,
    route_forwards,
    wait_converged,
)
from fleetserve_e2e.testing import wait_for_ready_pods

MIB = 2**20
SMOLLM2 = {"name": "smollm2", "version": "1", "uri": "builtin://smollm2-135m"}
GATEWAY = {
    "provider": "gateway-api",
    "parentRefs": [{"name": "fleetserve-gateway"}],
    "hostnames": ["smollm2.example.com"],
}


def _service(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def _smallest_budget(context: int) -> int:
    """The smallest budget whose best-case (bf16) pool holds one SmolLM2 context.

    As the operator's pydantic rule computes it: 23040 bytes per token, 256Mi of weights,
    reserve 0.1.
    """
    need = -(-context // 16) * 16 * 23_040
    return int(-(-(need + 256 * MIB) // 0.9))


@pytest.mark.parametrize("spell", [int, str], ids=["integer", "string"])
def test_the_kv_cache_rule_holds_to_the_byte(
    crd: LocalCluster, kube: KubeClient, namespace: str, spell: type
) -> None:
    """The smallest budget that holds one 2048-token context passes; one byte less is 422."""
    fits = _smallest_budget(2048)
    for budget, accepted in ((fits, True), (fits - 1, False)):
        manifest = _service(
            "kv", model=SMOLLM2, memory={"budget": spell(budget)}, generation={"maxContext": 2048}
        )
        dry_run = {"dryRun": "All"}
        if accepted:
            kube.request("POST", fsvc_path(namespace), body=manifest, params=dry_run)
            continue
        with pytest.raises(KubeApiError) as refused:
            kube.request("POST", fsvc_path(namespace), body=manifest, params=dry_run)
        assert refused.value.status_code == 422
        assert "spec.memory.budget" in refused.value.message
        assert "cannot hold one generation.maxContext sequence" in refused.value.message


@pytest.mark.timeout(300)
def test_smollm2_becomes_ready_and_streams_a_chat_answer(
    crd: LocalCluster, kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """Ready with the engine's flags; a route of generation paths only; a streamed answer."""
    generation = {"maxRunningSequences": 4, "maxStepTokens": 128, "maxContext": 1024}
    manifest = _service(
        "smollm2",
        model=SMOLLM2,
        runtime={"replicas": {"min": 1, "max": 1}, "device": "cpu"},
        memory={"budget": "1Gi"},
        generation=generation,
        traffic=GATEWAY,
    )
    kube.create(fsvc_path(namespace), manifest)
    body = wait_converged(kube, namespace, "smollm2", ready={"stable": 1}, timeout_s=240.0)
    assert condition(body["status"], "Ready")["status"] == "True"

    route = children(kube, namespace, "smollm2")[("HTTPRoute", "smollm2")]
    assert route["spec"]["hostnames"] == GATEWAY["hostnames"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models",
                 "/v2/models/smollm2/generate", "/v2/models/smollm2/generate_stream"):  # fmt: skip
        assert route_forwards(route, path), path
    for path in ("/v2/models/smollm2/infer", "/v2/models/other/generate",
                 "/v2/repository/index", "/metrics", "/v2/health/ready"):  # fmt: skip
        assert not route_forwards(route, path), path

    (pod,) = wait_for_ready_pods(kube, namespace, count=1, timeout_s=60.0)
    (process,) = [p for p in crd.pod_addresses() if p.pod == pod["metadata"]["name"]]
    running = process_args(process.pid)
    assert flag(running, "generation-max-running-sequences") == "4"
    assert flag(running, "generation-max-step-tokens") == "128"
    assert flag(running, "generation-max-context") == "1024"
    termination = pod["spec"]["terminationGracePeriodSeconds"]
    pre_stop = pod["spec"]["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert (pre_stop, termination) == (120, 145)

    deltas: list[str] = []
    answer = stream_chat(
        process.url,
        "smollm2",
        "What is the capital of France?",
        max_tokens=24,
        on_delta=deltas.append,
    )
    assert "Paris" in answer.text
    assert answer.chunks == len(deltas) > 1
    assert "".join(deltas) == answer.text
    assert 1 < answer.completion_tokens <= 24
