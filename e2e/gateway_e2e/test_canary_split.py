"""The canary split a real gateway enforces: Traefik routing by the operator's routes.

One synthetic InferenceService with gateway-api traffic on the Gateway `gateway` and gRPC
turned on, served by Traefik (`conftest.py`), rolls out version 2 in steps of 10 and 50
percent, each held (an hour's interval) until the test promotes it; Traefik must listen on
127.0.0.1 only. At each step, once Traefik's API shows the routes' weights, `REQUESTS` HTTP
requests (the HTTPRoute) and then `REQUESTS` gRPC calls made with NVIDIA's tritonclient stubs
(the GRPCRoute, h2c to the pods) go through Traefik's entry point to the service's hostname,
and each answer's model version says which track served it ("1": stable, "2": canary). The
canary's measured share must lie within `TOLERANCE_POINTS` of the weight for both protocols;
the test prints `split protocol=<http|grpc> step=<weight> canary=<n>/<total> share=<percent>
...` per step and protocol.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from fleetserve_e2e import KubeClient
from fleetserve_e2e.gateway import LocalTraefik, create_gateway, is_programmed
from fleetserve_e2e.listeners import listening_addresses
from fleetserve_e2e.loadgen import track_weights
from fleetserve_e2e.operator_process import OperatorProcess, child_path, fsvc_path, fsvc_status
from fleetserve_e2e.operator_testing import synthetic_service
from fleetserve_e2e.rollout_testing import ROLLOUT_SETTINGS
from fleetserve_e2e.waiting import wait_until

NAME = "demo"
GATEWAY = "gateway"
STEPS = [10, 50, 100]
MEASURED_STEPS = STEPS[:-1]
REQUESTS = 5_000
TOLERANCE_POINTS = 2.0
CONCURRENCY = 8
MAX_RATE_RPS = 400.0
"""A ceiling on the load, so the runtimes and Traefik stay far from saturating two cores."""
STEP_DEADLINE_S = 240.0
"""At 400 rps the 5,000 requests take 12.5 s; on the loaded 2-core machine they took about
50 s (about 100 rps). Requests past the deadline count as failed."""
HOST = "split.example"
"""The service's hostname: a gRPC call names its model inside the message, so a GRPCRoute
needs one, and both routes match it."""
GRPC_PORT = 9000
PROMOTE = "serving.fleetserve.io/promote"
VERSION_TRACK = {"1": "stable", "2": "canary"}


def _model(version: str) -> dict[str, str]:
    return {"name": NAME, "version": version, "uri": "builtin://synthetic?latency_ms=1"}


def _service() -> dict[str, Any]:
    """One replica per track, gateway-api traffic on `GATEWAY` with gRPC, steps held."""
    return synthetic_service(
        NAME,
        model=_model("1"),
        traffic={"provider": "gateway-api", "parentRefs": [{"name": GATEWAY}], "hostnames": [HOST]},
        runtime={
            "replicas": {"min": 1, "max": 1},
            "device": "cpu",
            "threads": 1,
            "grpc": {"enabled": True, "port": GRPC_PORT},
        },
        rollout={"steps": STEPS, "interval": "1h", "progressDeadline": "2h"},
    )


def _route_weights(kube: KubeClient, namespace: str, kind: str) -> dict[str, int]:
    return track_weights(kube.get(child_path(kind, namespace, NAME)), NAME)


def _traefik_weights(traefik: LocalTraefik, kind: str) -> dict[str, int]:
    """The weights of the weighted service Traefik built for the route of `kind`, by track.

    Traefik names it after the route's kind (`httproute-<namespace>-demo-gw-...-wrr`) and its
    children after the track Services (`...-svc-<namespace>-demo-stable-<index>`); a child
    counts only once Traefik has a server for it (a ready endpoint): before that, Traefik
    answers the child's share of the requests with 503.
    """
    response = httpx.get(f"{traefik.api_url}/api/http/services", timeout=5.0, trust_env=False)
    services = response.json()
    servers = {
        service["name"].split("@")[0]: service.get("loadBalancer", {}).get("servers", [])
        for service in services
    }
    weights: dict[str, int] = {}
    for service in services:
        if not service["name"].startswith(f"{kind.lower()}-"):
            continue
        for child in service.get("weighted", {}).get("services", []):
            served = servers.get(child["name"].split("@")[0])
            for track in VERSION_TRACK.values():
                if f"-{NAME}-{track}-" in child["name"] and served:
                    weights[track] = int(child["weight"])
    return weights


Call = Callable[[], Awaitable[str]]
"""One inference request through the gateway; returns the answer's model version, or
`error <what>`."""


async def _paced(call: Call, requests: int) -> Counter[str]:
    """Make `requests` calls, `CONCURRENCY` at a time under `MAX_RATE_RPS`; count by track."""
    counts: Counter[str] = Counter()
    queue = iter(range(requests))
    period_s = CONCURRENCY / MAX_RATE_RPS
    deadline = time.monotonic() + STEP_DEADLINE_S

    async def worker() -> None:
        for _ in queue:
            if time.monotonic() > deadline:
                counts["error deadline"] += 1
                continue
            started = time.monotonic()
            answer = await call()
            counts[VERSION_TRACK.get(answer, answer)] += 1
            await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return counts


async def _measure_http(url: str, requests: int) -> Counter[str]:
    """HTTP inference requests to the service's hostname (the HTTPRoute)."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["split"]}]}
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(
        timeout=10.0, limits=limits, trust_env=False, headers={"Host": HOST}
    ) as client:

        async def call() -> str:
            try:
                response = await client.post(f"{url}/v2/models/{NAME}/infer", json=body)
            except httpx.HTTPError as error:
                return f"error {type(error).__name__}"
            if response.status_code != httpx.codes.OK:
                return f"error {response.status_code}"
            return str(response.json()["model_version"])

        return await _paced(call, requests)


async def _measure_grpc(address: str, requests: int) -> Counter[str]:
    """OIP gRPC `ModelInfer` calls to the service's hostname (the GRPCRoute), one channel.

    Traefik routes each HTTP/2 stream on its own, so one channel still sees the split.
    """
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="text",
        datatype="BYTES",
        shape=[1],
        contents=service_pb2.InferTensorContents(bytes_contents=[b"split"]),
    )
    request = service_pb2.ModelInferRequest(model_name=NAME, inputs=[tensor])
    options = [("grpc.default_authority", HOST)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def call() -> str:
            try:
                answer = await stub.ModelInfer(request, timeout=10.0)
            except grpc.aio.AioRpcError as error:
                return f"error {error.code().name}"
            return str(answer.model_version)

        return await _paced(call, requests)


ROUTES = ("HTTPRoute", "GRPCRoute")


def _wait_for_weights(
    kube: KubeClient, namespace: str, traefik: LocalTraefik, wanted: dict[str, int]
) -> None:
    """Wait until both routes say `wanted`, then until Traefik routes by them."""
    for kind in ROUTES:
        wait_until(
            lambda kind=kind: _route_weights(kube, namespace, kind) == wanted,
            timeout_s=120.0,
            what=f"the {kind} at {wanted}",
        )
        wait_until(
            lambda kind=kind: _traefik_weights(traefik, kind) == wanted,
            timeout_s=60.0,
            what=f"Traefik's weighted service of the {kind} at {wanted}",
        )


@pytest.mark.timeout(720)
def test_traefik_splits_http_and_grpc_by_the_routes_weights(
    kube: KubeClient,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    traefik: LocalTraefik,
) -> None:
    """At the 10% and 50% steps Traefik sends each route's share of 5,000 calls to the canary."""
    assert traefik.process is not None
    hosts = {host for host, _port in listening_addresses(traefik.process.pid)}
    assert hosts == {"127.0.0.1"}, f"Traefik listens beyond the loopback: {hosts}"
    start_operator(ROLLOUT_SETTINGS)
    create_gateway(kube, namespace, GATEWAY, traefik.port)
    wait_until(
        lambda: is_programmed(kube, namespace, GATEWAY), timeout_s=60.0, what="Gateway programmed"
    )
    kube.create(fsvc_path(namespace), _service())

    def stable_serves() -> bool:
        status = fsvc_status(kube, namespace, NAME)
        return status.get("stableVersion") == "1" and status.get("phase") == "Succeeded"

    wait_until(stable_serves, timeout_s=120.0, what="version 1 to serve")
    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"model": _model("2")}})

    measures = {
        "http": lambda: _measure_http(traefik.url, REQUESTS),
        "grpc": lambda: _measure_grpc(f"127.0.0.1:{traefik.port}", REQUESTS),
    }
    shares: dict[tuple[str, int], float] = {}
    for weight in MEASURED_STEPS:
        wanted = {"stable": 100 - weight, "canary": weight}
        _wait_for_weights(kube, namespace, traefik, wanted)
        for protocol, measure in measures.items():
            started = time.monotonic()
            counts = asyncio.run(measure())
            seconds = time.monotonic() - started
            total = sum(counts.values())
            share = shares[protocol, weight] = 100.0 * counts["canary"] / total
            print(
                f"split protocol={protocol} step={weight} canary={counts['canary']}/{total} "
                f"share={share:.2f}% answers={dict(counts)} seconds={seconds:.1f}",
                flush=True,
            )
            assert set(counts) <= {"stable", "canary"}, f"{protocol}: answers {dict(counts)}"
            assert total == REQUESTS
        kube.merge_patch(
            fsvc_path(namespace, NAME), {"metadata": {"annotations": {PROMOTE: "next"}}}
        )
    for (protocol, weight), share in shares.items():
        assert abs(share - weight) <= TOLERANCE_POINTS, f"{protocol} {weight}%: {share:.2f}%"
