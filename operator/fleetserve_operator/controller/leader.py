"""Leader election on a `coordination.k8s.io/v1` Lease: one replica reconciles, the rest wait.

Why a Lease and not kopf's peering: peering is cooperative. Each kopf process announces
itself in a peering object (a CRD of its own) and pauses while it sees a peer of higher
priority; peers of equal priority, as two replicas of one Deployment are, all freeze. Nothing
stops a process that no longer sees the peering object (a partition, a stuck watch) from
carrying on, so two operators can reconcile at once. A Lease is what client-go and
controller-runtime use: every write names the `resourceVersion` it read, so of two candidates
only one write succeeds, and the holder exits when it cannot renew within the renew
deadline, which is shorter than the lease duration a candidate waits before taking over.

A candidate judges expiry on its own monotonic clock, from the moment it saw the Lease change
(`observe`), never from the `renewTime` written in it: clocks of different nodes may disagree,
and a candidate must not take a lease early because its clock runs ahead.

The decisions (`observe`, `may_take`, `claimed`, `released`, `lost`) are pure functions;
`KubeLeases` is the thin adapter to the API server; `LeaderElector` runs them: `acquire` blocks
a standby, `start_renewing` renews from a background thread and calls back when the lease
is lost, `release` clears the holder on a clean stop so a standby takes over at once.
`StandbyProbe` answers `/healthz` while a replica waits, before kopf serves it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Protocol

import kubernetes
import urllib3
from prometheus_client import CollectorRegistry, Gauge

__all__ = [
    "LEADER_GAUGE",
    "KubeLeases",
    "LeaderElector",
    "LeaseConflict",
    "LeaseRecord",
    "LeaseStore",
    "LeaseTiming",
    "LeaseUnavailable",
    "LeaseObservation",
    "StandbyProbe",
    "candidate_identity",
    "claimed",
    "lost",
    "may_take",
    "observe",
    "released",
]

logger = logging.getLogger(__name__)

LEADER_GAUGE = "fleetserve_operator_leader"
_MIN_TIMEOUT_S = 0.05

LeaseSpec = dict[str, Any]


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """How long a lease lasts, how soon its holder must renew it, how often candidates try."""

    lease_duration_s: int
    renew_deadline_s: float
    retry_period_s: float


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The Lease as read from (or written to) the API server."""

    holder: str
    """`spec.holderIdentity`; empty when nobody holds it (released)."""
    duration_s: int
    transitions: int
    acquire_time: str | None
    resource_version: str


@dataclass(frozen=True, slots=True)
class LeaseObservation:
    """The version of the Lease a candidate last saw, and when (its own monotonic clock)."""

    resource_version: str | None
    """None: the Lease did not exist."""
    seen_at: float


def candidate_identity(pod_name: str) -> str:
    """The pod's name and a random suffix: a restarted container is a new candidate."""
    return f"{pod_name}_{uuid.uuid4().hex[:8]}"


def _micro_time(moment: datetime) -> str:
    """RFC 3339 with microseconds, as a Lease's MicroTime fields are written.

    Never a whole second: the client re-serializes the time with `isoformat()`, which drops a
    zero fraction, and the API server parses MicroTime with a fixed six-digit fraction.
    """
    return moment.astimezone(UTC).replace(microsecond=moment.microsecond or 1).isoformat()


def observe(
    previous: LeaseObservation | None, record: LeaseRecord | None, now: float
) -> LeaseObservation:
    """What a candidate knows after reading `record` at `now`: unchanged keeps the old time."""
    version = None if record is None else record.resource_version
    if previous is not None and previous.resource_version == version:
        return previous
    return LeaseObservation(version, now)


def may_take(
    record: LeaseRecord | None, observation: LeaseObservation, identity: str, now: float
) -> bool:
    """Whether `identity` may write itself into the Lease as holder now.

    Yes when there is no Lease, nobody holds it, `identity` holds it (a renewal), or it has
    not changed for a whole lease duration as this candidate watched it.
    """
    if record is None or not record.holder or record.holder == identity:
        return True
    return now - observation.seen_at >= record.duration_s


def claimed(
    record: LeaseRecord | None, identity: str, timing: LeaseTiming, now: datetime
) -> LeaseSpec:
    """The Lease spec `identity` writes to take (or renew) `record`."""
    stamp = _micro_time(now)
    if record is None:
        return {
            "holderIdentity": identity,
            "leaseDurationSeconds": timing.lease_duration_s,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        }
    renewing = record.holder == identity
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": timing.lease_duration_s,
        "acquireTime": record.acquire_time if renewing else stamp,
        "renewTime": stamp,
        "leaseTransitions": record.transitions if renewing else record.transitions + 1,
    }


def released(record: LeaseRecord, now: datetime) -> LeaseSpec:
    """The Lease spec that hands `record` back: no holder, so any candidate takes it at once."""
    stamp = _micro_time(now)
    return {
        "holderIdentity": None,
        "leaseDurationSeconds": record.duration_s,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": record.transitions,
    }


def lost(
    record: LeaseRecord | None,
    identity: str,
    *,
    renewed_at: float,
    now: float,
    timing: LeaseTiming,
) -> str | None:
    """Why the leader must stop (another holder, or no renewal within the renew deadline).

    None while it may go on. The renew deadline is shorter than the lease duration that a
    candidate waits, so a leader that cannot renew stops before anyone else may start.
    """
    if record is not None and record.holder != identity:
        return f"the lease is held by {record.holder or 'nobody'}"
    if now - renewed_at >= timing.renew_deadline_s:
        return f"not renewed for {now - renewed_at:.1f} s (deadline {timing.renew_deadline_s} s)"
    return None


class LeaseConflict(Exception):
    """The Lease changed since it was read (409): another candidate wrote first."""


class LeaseUnavailable(Exception):
    """The API server could not be reached, or refused the Lease request."""


class LeaseStore(Protocol):
    """Reads and optimistic writes of one Lease; `KubeLeases` talks to the API server."""

    def get(self, timeout_s: float) -> LeaseRecord | None:
        """The Lease, or None when it does not exist."""
        ...

    def create(self, spec: LeaseSpec, timeout_s: float) -> LeaseRecord:
        """Create the Lease (LeaseConflict when it exists meanwhile)."""
        ...

    def replace(self, spec: LeaseSpec, resource_version: str, timeout_s: float) -> LeaseRecord:
        """Write `spec` if the Lease is still at `resource_version` (else LeaseConflict)."""
        ...


def _record(lease: kubernetes.client.V1Lease) -> LeaseRecord:
    spec = lease.spec or kubernetes.client.V1LeaseSpec()
    acquired = spec.acquire_time
    return LeaseRecord(
        holder=spec.holder_identity or "",
        duration_s=spec.lease_duration_seconds or 0,
        transitions=spec.lease_transitions or 0,
        acquire_time=None if acquired is None else _micro_time(acquired),
        resource_version=str(lease.metadata.resource_version if lease.metadata else ""),
    )


class KubeLeases:
    """One Lease through the official client's CoordinationV1Api."""

    def __init__(self, api: kubernetes.client.CoordinationV1Api, namespace: str, name: str) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name

    @classmethod
    def over(cls, client: kubernetes.client.ApiClient, namespace: str, name: str) -> KubeLeases:
        """The Lease `namespace/name`, through an authenticated client (`KubeApi.api_client`)."""
        return cls(kubernetes.client.CoordinationV1Api(client), namespace, name)

    def _body(self, spec: LeaseSpec, resource_version: str | None) -> dict[str, Any]:
        metadata: dict[str, str] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    def _call(
        self, request: Callable[[], kubernetes.client.V1Lease], *, missing_ok: bool = False
    ) -> LeaseRecord | None:
        where = f"Lease {self.namespace}/{self.name}"
        try:
            return _record(request())
        except kubernetes.client.ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            if exc.status == 409:
                raise LeaseConflict(f"{where} changed since it was read") from exc
            raise LeaseUnavailable(f"{where}: {exc.status} {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise LeaseUnavailable(f"{where}: {exc}") from exc

    def _written(self, request: Callable[[], kubernetes.client.V1Lease]) -> LeaseRecord:
        record = self._call(request)
        if record is None:
            raise AssertionError("unreachable: only a read may find no Lease")
        return record

    def get(self, timeout_s: float) -> LeaseRecord | None:
        """The Lease, or None when it does not exist."""
        return self._call(
            lambda: self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=timeout_s
            ),
            missing_ok=True,
        )

    def create(self, spec: LeaseSpec, timeout_s: float) -> LeaseRecord:
        """POST the Lease; AlreadyExists (another candidate created it first) is a conflict."""
        body = self._body(spec, None)
        return self._written(
            lambda: self._api.create_namespaced_lease(
                self.namespace,
                body,  # type: ignore[arg-type]  # validated into a V1Lease by the client
                _request_timeout=timeout_s,
            )
        )

    def replace(self, spec: LeaseSpec, resource_version: str, timeout_s: float) -> LeaseRecord:
        """PUT the Lease naming `resource_version`: the API server refuses it if it changed."""
        body = self._body(spec, resource_version)
        return self._written(
            lambda: self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                body,  # type: ignore[arg-type]  # validated into a V1Lease by the client
                _request_timeout=timeout_s,
            )
        )


class LeaderElector:
    """Campaigns for, renews and releases one Lease as `identity`.

    `fleetserve_operator_leader` on `registry` reads 1 while this replica holds the lease.
    """

    def __init__(
        self,
        store: LeaseStore,
        *,
        identity: str,
        timing: LeaseTiming,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.identity = identity
        self._store = store
        self._timing = timing
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._gauge = Gauge(
            LEADER_GAUGE,
            "1 while this replica holds the leader Lease and reconciles; 0 while it waits.",
            registry=registry,
        )
        self._gauge.set(0)
        self._observation: LeaseObservation | None = None
        self._record: LeaseRecord | None = None
        self._renewed_at = 0.0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def try_acquire(self) -> bool:
        """One attempt to take or renew the lease; True when this replica holds it now."""
        return self._round(self._clock() + self._timing.renew_deadline_s)

    def acquire(self) -> None:
        """Block until this replica holds the lease (a standby waits here)."""
        logger.info("Waiting to lead as %s", self.identity)
        while not self.try_acquire():
            self._sleep(self._timing.retry_period_s)
        logger.info("Leading as %s", self.identity)

    def start_renewing(self, on_lost: Callable[[str], None]) -> None:
        """Renew every retry period in a thread; call `on_lost(reason)` if the lease is lost."""
        self._renewer = threading.Thread(
            target=self._renew_loop, args=(on_lost,), name="lease-renewer", daemon=True
        )
        self._renewer.start()

    def release(self) -> None:
        """Stop renewing and clear the holder, so a standby need not wait for expiry."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        record = self._record
        self._gauge.set(0)
        if record is None or record.holder != self.identity:
            return
        try:
            self._record = self._store.replace(
                released(record, self._wall()),
                record.resource_version,
                self._timing.renew_deadline_s,
            )
        except (LeaseConflict, LeaseUnavailable) as exc:
            logger.warning("Could not release the lease (it expires by itself): %s", exc)
            return
        logger.info("Released the lease as %s", self.identity)

    def _timeout(self, deadline: float) -> float:
        return max(deadline - self._clock(), _MIN_TIMEOUT_S)

    def _round(self, deadline: float) -> bool:
        started = self._clock()
        try:
            record = self._store.get(self._timeout(deadline))
            self._observation = observe(self._observation, record, self._clock())
            self._record = record
            if not may_take(record, self._observation, self.identity, self._clock()):
                return False
            spec = claimed(record, self.identity, self._timing, self._wall())
            timeout = self._timeout(deadline)
            if record is None:
                written = self._store.create(spec, timeout)
            else:
                written = self._store.replace(spec, record.resource_version, timeout)
        except LeaseConflict:
            return False
        except LeaseUnavailable as exc:
            logger.warning("Lease request failed: %s", exc)
            return False
        self._observation = observe(self._observation, written, self._clock())
        self._record = written
        # The lease counts from when the write was sent: the API server applied it no
        # earlier, so a candidate's wait starts no earlier either.
        self._renewed_at = started
        self._gauge.set(1)
        return True

    def _renew_loop(self, on_lost: Callable[[str], None]) -> None:
        while not self._stop.wait(self._timing.retry_period_s):
            if self._round(self._renewed_at + self._timing.renew_deadline_s):
                continue
            reason = lost(
                self._record,
                self.identity,
                renewed_at=self._renewed_at,
                now=self._clock(),
                timing=self._timing,
            )
            if reason is not None and not self._stop.is_set():
                self._gauge.set(0)
                on_lost(reason)
                return


class _StandbyHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path == "/healthz"
        body = b'{"leader": false}' if found else b""
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: probes every few seconds would flood the operator's log."""


class StandbyProbe:
    """Answers `/healthz` on kopf's liveness port while this replica waits for the lease.

    A standby is alive and ready: without this its probes would fail until it leads, the
    kubelet would restart it over and over, and the PodDisruptionBudget would count it out.
    """

    def __init__(self, address: str, port: int) -> None:
        self._server = ThreadingHTTPServer((address, port), _StandbyHandler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="standby-probe", daemon=True
        )

    def __enter__(self) -> StandbyProbe:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Frees the port before kopf binds its own liveness endpoint to it.
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
