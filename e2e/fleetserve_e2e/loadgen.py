"""A bounded load driver that plays the gateway: requests follow the HTTPRoute's weights.

The e2e cluster stores and validates HTTPRoutes but no gateway programs them, so the driver
does what a gateway would: every `route_poll_s` it reads the route's backendRefs weights,
and each request picks a track by those weights and one of that track's ready pods from the
harness's pod map. It records every request (send time, track, HTTP status) and every change
of the weights, runs on its own thread with its own event loop, and stops by itself after
`duration_s` (or when the test leaves the `with` block).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field

import httpx

from fleetserve_e2e import KubeClient, LocalCluster
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.lifecycle import Component
from fleetserve_e2e.operator_process import INSTANCE_LABEL, TRACK_LABEL, child_path, get_or_none
from fleetserve_e2e.pod_map import PodAddress
from fleetserve_e2e.waiting import wait_until

NO_ANSWER = 0
"""Status recorded when no ready pod of the track exists or the connection failed."""

START_WAIT_S = 30.0
"""How long the driver waits, before its first request, to see the fleet it is to load."""
ROUTE_CHANGE_S = 30.0
"""How long a route change the operator has written may take to reach the driver's samples."""


def track_weights(route: JsonObject, name: str) -> dict[str, int]:
    """An InferenceService's HTTPRoute weights by track (its backends are `<name>-<track>`)."""
    refs = route["spec"]["rules"][0]["backendRefs"]
    return {ref["name"].removeprefix(f"{name}-"): ref["weight"] for ref in refs}


def canary_weight(route: JsonObject, name: str) -> int:
    """The canary's weight in an InferenceService's HTTPRoute, over all its rules; 0: none."""
    refs = [ref for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    return next((ref["weight"] for ref in refs if ref["name"] == f"{name}-canary"), 0)


@dataclass(frozen=True)
class Record:
    """One request: when it was sent (monotonic seconds), to which track, and its status."""

    time: float
    track: str
    status: int

    @property
    def is_server_error(self) -> bool:
        """A 5xx answer, or no answer at all."""
        return self.status >= 500 or self.status == NO_ANSWER


@dataclass(frozen=True)
class RouteSample:
    """The HTTPRoute's weights per track as first seen at `time` (monotonic seconds)."""

    time: float
    weights: dict[str, int]


@dataclass
class LoadDriver(Component):
    """Sends `rate_rps` requests per second to the InferenceService `name`, for `duration_s`."""

    cluster: LocalCluster
    namespace: str
    name: str
    model: str
    rate_rps: float = 25.0
    duration_s: float = 150.0
    concurrency: int = 4
    route_poll_s: float = 0.2
    records: list[Record] = field(default_factory=list)
    routes: list[RouteSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pods: list[PodAddress] = field(default_factory=list)
    _random: random.Random = field(default_factory=lambda: random.Random(5))

    def _start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop sending and wait for the driver's thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)

    @property
    def weights(self) -> dict[str, int]:
        """The weights the driver routes by now (empty before the route exists)."""
        return self.routes[-1].weights if self.routes else {}

    def wait_canary_gone(self) -> None:
        """Wait until the route the driver follows gives the canary no weight.

        The operator writes status before the route (write-ahead): a test that saw the status
        change waits here before it reads `routes`, or its samples may end before the route's.
        """
        wait_until(
            lambda: not self.weights.get("canary"),
            timeout_s=ROUTE_CHANGE_S,
            what="the load driver to see no canary weight in the route",
        )

    def canary_steps(self) -> list[int]:
        """The canary weights the driver routed by, in order, its zero weights left out."""
        return [w for w in (s.weights.get("canary") for s in self.routes) if w]

    def canary_gone_after(self, since: float) -> float | None:
        """When the driver first saw the canary without weight after `since`; None: not yet."""
        return next(
            (s.time for s in self.routes if s.time > since and not s.weights.get("canary")), None
        )

    def by_track(self, track: str) -> list[Record]:
        """The records of requests routed to `track`."""
        return [record for record in list(self.records) if record.track == track]

    async def _main(self) -> None:
        kube = KubeClient(self.cluster.server, self.cluster.pki)
        try:
            await self._until_serving(kube)
            deadline = time.monotonic() + self.duration_s
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                workers = [self._worker(client, i, deadline) for i in range(self.concurrency)]
                await asyncio.gather(self._follow(kube, deadline), *workers)
        finally:
            kube.close()

    async def _until_serving(self, kube: KubeClient) -> None:
        """Wait (at most `START_WAIT_S`) for the route and a ready pod of each weighted track.

        So the first requests are not recorded as unanswered only because the driver's own
        view of the fleet lagged the test's: a gateway starts with its view in place.
        """
        until = time.monotonic() + START_WAIT_S
        while self._running(until):
            await self._refresh(kube)
            tracks = {pod.labels.get(TRACK_LABEL) for pod in self._pods}
            weighted = {track for track, weight in self.weights.items() if weight > 0}
            if weighted and weighted <= tracks:
                return
            await asyncio.sleep(self.route_poll_s)

    def _running(self, deadline: float) -> bool:
        return not self._stop.is_set() and time.monotonic() < deadline

    async def _follow(self, kube: KubeClient, deadline: float) -> None:
        """Read the route's weights and the pod map every `route_poll_s`."""
        while self._running(deadline):
            await self._refresh(kube)
            await asyncio.sleep(self.route_poll_s)

    async def _refresh(self, kube: KubeClient) -> None:
        """Read the route's weights (a sample when they change) and the ready pods once."""
        path = child_path("HTTPRoute", self.namespace, self.name)
        route = await asyncio.to_thread(get_or_none, kube, path)
        if route is not None:
            weights = track_weights(route, self.name)
            if weights != self.weights:
                self.routes.append(RouteSample(time.monotonic(), weights))
        self._pods = [
            pod
            for pod in self.cluster.pod_addresses()
            if pod.namespace == self.namespace
            and pod.ready
            and pod.labels.get(INSTANCE_LABEL) == self.name
        ]

    def _pick(self) -> tuple[str, PodAddress | None] | None:
        weights = {track: w for track, w in self.weights.items() if w > 0}
        if not weights:
            return None
        track = self._random.choices(list(weights), weights=list(weights.values()))[0]
        pods = [pod for pod in self._pods if pod.labels.get(TRACK_LABEL) == track]
        return track, (self._random.choice(pods) if pods else None)

    async def _worker(self, client: httpx.AsyncClient, worker: int, deadline: float) -> None:
        period_s = self.concurrency / self.rate_rps
        sent = 0
        while self._running(deadline):
            started = time.monotonic()
            picked = self._pick()
            if picked is not None:
                track, pod = picked
                text = f"request {worker}-{sent} of the rollout load"  # unique: no cache hit
                status = NO_ANSWER if pod is None else await self._send(client, pod, text)
                self.records.append(Record(started, track, status))
                sent += 1
            await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))

    async def _send(self, client: httpx.AsyncClient, pod: PodAddress, text: str) -> int:
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
        try:
            response = await client.post(f"{pod.url}/v2/models/{self.model}/infer", json=body)
        except httpx.HTTPError:
            return NO_ANSWER
        return response.status_code
