"""gRPC from an InferenceService: pods listen, Services expose it, a GRPCRoute splits it.

The operator runs under its RBAC role against the real API server, whose Gateway API schema
validates the GRPCRoute; NVIDIA's `tritonclient.grpc` then calls the pod's gRPC listener.
"""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as triton

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.operator_process import MANAGER, OperatorProcess, child_path, fsvc_path
from fleetserve_e2e.operator_testing import synthetic_service, wait_converged

NAME = "demo"
GRPC_PORT = 9000
TRAFFIC = {
    "provider": "gateway-api",
    "parentRefs": [{"name": "gateway"}],
    "hostnames": ["embed.example.com"],
}
RUNTIME = {
    "replicas": {"min": 1, "max": 1},
    "device": "cpu",
    "threads": 1,
    "grpc": {"enabled": True, "port": GRPC_PORT},
}


def _weights(route: JsonObject) -> dict[str, int]:
    (rule,) = route["spec"]["rules"]
    return {ref["name"]: ref["weight"] for ref in rule["backendRefs"]}


def test_grpc_is_served_exposed_and_routed_with_the_http_routes_weights(
    kube: KubeClient, local_cluster: LocalCluster, namespace: str, operator: OperatorProcess
) -> None:
    """The GRPCRoute is stored beside the HTTPRoute with its weights; a real gRPC call answers."""
    kube.create(fsvc_path(namespace), synthetic_service(NAME, traffic=TRAFFIC, runtime=RUNTIME))
    wait_converged(kube, namespace, NAME, ready={"stable": 1})
    http_route = kube.get(child_path("HTTPRoute", namespace, NAME))
    grpc_route = kube.get(child_path("GRPCRoute", namespace, NAME))
    assert grpc_route["spec"]["parentRefs"] == http_route["spec"]["parentRefs"]
    assert grpc_route["spec"]["hostnames"] == TRAFFIC["hostnames"]
    assert _weights(grpc_route) == _weights(http_route) == {f"{NAME}-stable": 100}
    (rule,) = grpc_route["spec"]["rules"]
    assert {ref["port"] for ref in rule["backendRefs"]} == {GRPC_PORT}
    (owner,) = grpc_route["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceService", NAME, True)
    assert [e["manager"] for e in grpc_route["metadata"]["managedFields"]] == [MANAGER]
    for service in (NAME, f"{NAME}-stable"):
        ports = kube.get(child_path("Service", namespace, service))["spec"]["ports"]
        grpc = {p["name"]: p for p in ports}["grpc"]
        assert (grpc["port"], grpc["appProtocol"]) == (GRPC_PORT, "kubernetes.io/h2c"), service
    (pod,) = [p for p in local_cluster.pod_addresses() if p.namespace == namespace]
    assert pod.grpc_address is not None, "the pod was started without --grpc-port"
    client = triton.InferenceServerClient(pod.grpc_address)
    assert client.is_model_ready(NAME)
    text = triton.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"a quiet library", b"the sea"], dtype=np.object_))
    embeddings = client.infer(NAME, [text]).as_numpy("embedding")
    assert embeddings is not None
    assert embeddings.shape[0] == 2
    assert embeddings.dtype == np.float32
