"""The canary split a real gateway enforces: Traefik routing by the operator's HTTPRoute.

One synthetic InferenceService with gateway-api traffic on the Gateway `gateway`, served by
Traefik (`conftest.py`), rolls out version 2 in steps of 10 and 50 percent, each held (an hour's
interval) until the test promotes it; Traefik must listen on 127.0.0.1 only. At each step,
once Traefik's API shows the route's weights, `REQUESTS` requests go through Traefik's entry
point and each answer's `model_version` says which track served it ("1": stable, "2":
canary). The canary's measured share must lie within `TOLERANCE_POINTS` of the HTTPRoute's
weight; the test prints
`split step=<weight> canary=<n>/<total> share=<percent> ...` per step.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from fleetserve_e2e import KubeClient
from fleetserve_e2e.gateway import LocalTraefik, create_gateway, is_programmed
from fleetserve_e2e.listeners import listening_addresses
from fleetserve_e2e.loadgen import track_weights
from fleetserve_e2e.operator_process import OperatorProcess, child_path, fsvc_path
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
PROMOTE = "serving.fleetserve.io/promote"
VERSION_TRACK = {"1": "stable", "2": "canary"}


def _model(version: str) -> dict[str, str]:
    return {"name": NAME, "version": version, "uri": "builtin://synthetic?latency_ms=1"}


def _service() -> dict[str, Any]:
    """One replica per track, gateway-api traffic on `GATEWAY`, steps held until promoted."""
    return synthetic_service(
        NAME,
        model=_model("1"),
        traffic={"provider": "gateway-api", "parentRefs": [{"name": GATEWAY}]},
        rollout={"steps": STEPS, "interval": "1h", "progressDeadline": "2h"},
    )


def _status(kube: KubeClient, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = kube.get(fsvc_path(namespace, NAME)).get("status", {})
    return status


def _route_weights(kube: KubeClient, namespace: str) -> dict[str, int]:
    return track_weights(kube.get(child_path("HTTPRoute", namespace, NAME)), NAME)


def _traefik_weights(traefik: LocalTraefik) -> dict[str, int]:
    """The weights of the weighted service Traefik built for the route, by track.

    Its children are named after the track Services (`<namespace>-demo-stable-<port>`, ...);
    a child counts only once Traefik has a server for it (a ready endpoint): before that,
    Traefik answers the child's share of the requests with 503.
    """
    response = httpx.get(f"{traefik.api_url}/api/http/services", timeout=5.0, trust_env=False)
    services = response.json()
    servers = {
        service["name"].split("@")[0]: service.get("loadBalancer", {}).get("servers", [])
        for service in services
    }
    weights: dict[str, int] = {}
    for service in services:
        for child in service.get("weighted", {}).get("services", []):
            served = servers.get(child["name"].split("@")[0])
            for track in VERSION_TRACK.values():
                if f"-{NAME}-{track}-" in child["name"] and served:
                    weights[track] = int(child["weight"])
    return weights


async def _measure(url: str, requests: int) -> Counter[str]:
    """Send `requests` inference requests through the gateway; count answers by track.

    A request that fails or answers another status counts under `error <status>`.
    """
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["split"]}]}
    counts: Counter[str] = Counter()
    queue = iter(range(requests))
    period_s = CONCURRENCY / MAX_RATE_RPS
    deadline = time.monotonic() + STEP_DEADLINE_S

    async def worker(client: httpx.AsyncClient) -> None:
        for _ in queue:
            if time.monotonic() > deadline:
                counts["error deadline"] += 1
                continue
            started = time.monotonic()
            try:
                response = await client.post(f"{url}/v2/models/{NAME}/infer", json=body)
            except httpx.HTTPError as error:
                counts[f"error {type(error).__name__}"] += 1
            else:
                if response.status_code == httpx.codes.OK:
                    version = str(response.json()["model_version"])
                    counts[VERSION_TRACK.get(version, f"version {version}")] += 1
                else:
                    counts[f"error {response.status_code}"] += 1
            await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=10.0, limits=limits, trust_env=False) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return counts


def _wait_for_weights(
    kube: KubeClient, namespace: str, traefik: LocalTraefik, wanted: dict[str, int]
) -> None:
    """Wait until the HTTPRoute says `wanted`, then until Traefik routes by it."""
    wait_until(
        lambda: _route_weights(kube, namespace) == wanted,
        timeout_s=120.0,
        what=f"the HTTPRoute at {wanted}",
    )
    wait_until(
        lambda: _traefik_weights(traefik) == wanted,
        timeout_s=60.0,
        what=f"Traefik's weighted service at {wanted}",
    )


@pytest.mark.timeout(720)
def test_traefik_splits_traffic_by_the_httproute_weights(
    kube: KubeClient,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    traefik: LocalTraefik,
) -> None:
    """At the 10% and 50% steps Traefik sends the route's share of 5,000 requests to the canary."""
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
        status = _status(kube, namespace)
        return status.get("stableVersion") == "1" and status.get("phase") == "Succeeded"

    wait_until(stable_serves, timeout_s=120.0, what="version 1 to serve")
    kube.merge_patch(fsvc_path(namespace, NAME), {"spec": {"model": _model("2")}})

    shares: dict[int, float] = {}
    for weight in MEASURED_STEPS:
        wanted = {"stable": 100 - weight, "canary": weight}
        _wait_for_weights(kube, namespace, traefik, wanted)
        started = time.monotonic()
        counts = asyncio.run(_measure(traefik.url, REQUESTS))
        seconds = time.monotonic() - started
        total = sum(counts.values())
        shares[weight] = 100.0 * counts["canary"] / total
        print(
            f"split step={weight} canary={counts['canary']}/{total} "
            f"share={shares[weight]:.2f}% answers={dict(counts)} seconds={seconds:.1f}",
            flush=True,
        )
        assert set(counts) <= {"stable", "canary"}, f"failed or unknown answers: {dict(counts)}"
        assert total == REQUESTS
        kube.merge_patch(
            fsvc_path(namespace, NAME), {"metadata": {"annotations": {PROMOTE: "next"}}}
        )
    for weight, share in shares.items():
        assert abs(share - weight) <= TOLERANCE_POINTS, f"step {weight}: canary share {share:.2f}%"
