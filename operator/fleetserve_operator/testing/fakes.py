"""Test doubles: a fake cluster, fake metrics, a fake clock, spec factories.

tests/operator/ drives `sync.Sync` against `FakeKube` (an in-memory API server that records
every write) and feeds `FakeMetricSource` numbers instead of a Prometheus, so no cluster is
needed.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fleetserve_operator import naming
from fleetserve_operator.controller.kube import ObjectRef
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import ChildConflict, ChildRefused, MetricsUnavailable
from fleetserve_operator.records import EventNote, Manifest
from fleetserve_operator.spec import InferenceServiceSpec, InferenceServiceStatus


class QuietHandler(BaseHTTPRequestHandler):
    """A loopback server's request handler that answers in one call and logs nothing."""

    def reply(
        self,
        status: int,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        reason: str | None = None,
    ) -> None:
        """Answer `status` with `body`: its Content-Length, then `headers` (which may override)."""
        self.send_response(status, reason)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: http.server writes every request to stderr, into the test's output."""
        return


@contextlib.contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free loopback port in a thread; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def make_spec(**sections: Any) -> InferenceServiceSpec:
    """A valid spec (synthetic model, version 1) with `sections` (wire names) laid over it."""
    raw: Manifest = {"model": {"name": "demo", "version": "1", "uri": "builtin://synthetic"}}
    raw.update(sections)
    return InferenceServiceSpec.model_validate(raw)


def make_service(
    spec: Manifest | None = None, *, name: str = "demo", namespace: str = "ns"
) -> Manifest:
    """An InferenceService object as the API server would return it (generation 1, no status)."""
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
        "spec": spec or {"model": {"name": "demo", "version": "1", "uri": "builtin://synthetic"}},
    }


@dataclass
class FakeKube:
    """An in-memory stand-in for `kube.KubeApi` that records every write.

    `objects` maps (kind, namespace, name) to the stored object; `writes` lists
    (action, kind, name) for every create, apply, delete and status write, in order.
    `refusals` maps (kind, name) to the message the API server refuses that child with
    (on its dry-run as on its write). `on_write` runs after every write has been stored,
    the way another client would see the cluster then (a crash test raises there to stop
    the operator between two writes).
    """

    objects: dict[tuple[str, str, str], Manifest] = field(default_factory=dict)
    writes: list[tuple[str, str, str]] = field(default_factory=list)
    events: list[EventNote] = field(default_factory=list)
    claims: set[tuple[str, str]] = field(default_factory=set)
    secrets: dict[tuple[str, str, str], bytes] = field(default_factory=dict)
    """(namespace, Secret name, key) → value."""
    refusals: dict[tuple[str, str], str] = field(default_factory=dict)
    on_write: Callable[[], None] | None = None

    def add_service(self, body: Manifest) -> None:
        """Store an InferenceService."""
        meta = body["metadata"]
        self.objects[(naming.KIND, meta["namespace"], meta["name"])] = copy.deepcopy(body)

    def created(self) -> list[tuple[str, str]]:
        """The (kind, name) of every object created so far, sorted."""
        return sorted((kind, name) for action, kind, name in self.writes if action == "create")

    def get_child(self, manifest: Manifest) -> Manifest | None:
        """The stored object `manifest` names, or None."""
        found = self.objects.get(_key(manifest))
        return copy.deepcopy(found) if found else None

    def validate(self, manifest: Manifest, *, current: Manifest | None) -> None:
        """Refuse what `refusals` lists; a create (no `current`) also when its name is taken.

        Refusals first, as the API server validates a create before it looks for the name.
        """
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if (kind, name) in self.refusals:
            raise ChildRefused("spec", kind, name, self.refusals[(kind, name)])
        if current is None and _key(manifest) in self.objects:
            raise ChildConflict(kind, manifest["metadata"]["namespace"], name)

    def create(self, manifest: Manifest) -> Manifest:
        """Store a new object, its creator's `Update` entry; refused like `validate`."""
        self.validate(manifest, current=None)
        stored = self._store(manifest, None, operation="Update")
        self._wrote("create", manifest["kind"], manifest["metadata"]["name"])
        return stored

    def apply(self, manifest: Manifest, *, current: Manifest) -> Manifest:
        """Store `manifest` over `current`, keeping its status (generation moves with spec)."""
        self.validate(manifest, current=current)
        old = self.objects[_key(manifest)]
        assert old["metadata"]["uid"] == current["metadata"]["uid"], "applied to a replaced object"
        stored = self._store(manifest, old, operation="Apply")
        self._wrote("apply", manifest["kind"], manifest["metadata"]["name"])
        return stored

    def _wrote(self, action: str, kind: str, name: str) -> None:
        self.writes.append((action, kind, name))
        if self.on_write is not None:
            self.on_write()

    def _store(self, manifest: Manifest, old: Manifest | None, *, operation: str) -> Manifest:
        meta = manifest["metadata"]
        stored = copy.deepcopy(manifest)
        generation = 1 if old is None else old["metadata"]["generation"]
        if old is not None and old.get("spec") != manifest.get("spec"):
            generation += 1
        stored["metadata"]["generation"] = generation
        stored["metadata"]["uid"] = (
            f"uid-{meta['name']}-{len(self.writes)}" if old is None else old["metadata"]["uid"]
        )
        stored["metadata"]["managedFields"] = [{"manager": naming.MANAGER, "operation": operation}]
        if old is not None and "status" in old:
            stored["status"] = old["status"]
        self.objects[_key(manifest)] = stored
        return copy.deepcopy(stored)

    def apply_status(self, ref: ObjectRef, status: Manifest) -> Manifest | None:
        """Replace the InferenceService's status; returns the service as stored."""
        self.objects[(naming.KIND, ref.namespace, ref.name)]["status"] = copy.deepcopy(status)
        self._wrote("status", naming.KIND, ref.name)
        return self._service(ref)

    def delete(self, manifest: Manifest) -> None:
        """Remove a stored object; with a uid, only the object of that uid (as `KubeApi`)."""
        stored = self.objects.get(_key(manifest))
        uid = manifest["metadata"].get("uid")
        if stored is not None and uid and stored["metadata"].get("uid") != uid:
            return
        self.objects.pop(_key(manifest), None)
        self._wrote("delete", manifest["kind"], manifest["metadata"]["name"])

    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        """The stored InferenceService, or None."""
        found = self.objects.get((naming.KIND, namespace, name))
        return copy.deepcopy(found) if found else None

    def status_of(self, namespace: str, name: str) -> InferenceServiceStatus:
        """The stored InferenceService's status, parsed (empty before the first status write).

        Raises:
            AssertionError: the InferenceService is gone.
        """
        body = self.get_inference_service(namespace, name)
        if body is None:
            raise AssertionError(f"InferenceService {name} is gone")
        return InferenceServiceStatus.model_validate(body.get("status") or {})

    def pvc_exists(self, namespace: str, claim: str) -> bool:
        """Whether `claim` was added to `claims`."""
        return (namespace, claim) in self.claims

    def read_secret(self, namespace: str, name: str, key: str) -> bytes | None:
        """The value stored in `secrets`, or None."""
        return self.secrets.get((namespace, name, key))

    def list_children(self, namespace: str, owner: str) -> list[Manifest]:
        """Stored children labelled for `owner`."""
        return [obj for obj in self._owned(namespace, owner) if obj["kind"] != "Pod"]

    def _owned(self, namespace: str, owner: str) -> list[Manifest]:
        return [
            copy.deepcopy(obj)
            for (kind, ns, _), obj in self.objects.items()
            if kind != naming.KIND
            and ns == namespace
            and obj["metadata"].get("labels", {}).get(naming.INSTANCE_LABEL) == owner
        ]

    def list_pods(self, namespace: str, owner: str) -> list[Manifest]:
        """Stored pods labelled for `owner` (see `add_pod`)."""
        return [obj for obj in self._owned(namespace, owner) if obj["kind"] == "Pod"]

    def remove_annotation(self, ref: ObjectRef, annotation: str) -> Manifest | None:
        """Drop an annotation of the stored InferenceService; returns the service as stored."""
        body = self.objects[(naming.KIND, ref.namespace, ref.name)]
        body["metadata"].get("annotations", {}).pop(annotation, None)
        self._wrote("annotate", naming.KIND, ref.name)
        return self._service(ref)

    def remove_finalizer(self, service: Manifest, finalizer: str) -> Manifest | None:
        """Take `finalizer` off the stored InferenceService; None when it is gone."""
        meta = service["metadata"]
        key = (naming.KIND, meta["namespace"], meta["name"])
        if key not in self.objects:
            return None
        self.objects[key]["metadata"]["finalizers"].remove(finalizer)
        self._wrote("unfinalize", naming.KIND, meta["name"])
        return copy.deepcopy(self.objects[key])

    def _service(self, ref: ObjectRef) -> Manifest:
        """A copy of the stored InferenceService, as a write answers it (no read counted)."""
        return copy.deepcopy(self.objects[(naming.KIND, ref.namespace, ref.name)])

    def post_event(self, ref: ObjectRef, note: EventNote) -> None:
        """Record the event."""
        self.events.append(note)

    def add_pod(
        self, deployment: str, namespace: str = "ns", *, restarts: int = 0, reason: str = ""
    ) -> None:
        """Play the kubelet: a pod of Deployment `deployment`'s current template.

        `reason` is its container's last termination reason (e.g. `OOMKilled`).
        """
        template = self.objects[("Deployment", namespace, deployment)]["spec"]["template"]
        container: Manifest = {"name": "runtime", "restartCount": restarts}
        if reason:
            container["lastState"] = {"terminated": {"reason": reason, "exitCode": 137}}
        name = f"{deployment}-{len(self.objects)}"
        meta = {"name": name, "namespace": namespace, **copy.deepcopy(template["metadata"])}
        self.objects[("Pod", namespace, name)] = {
            "kind": "Pod",
            "metadata": meta,
            "status": {"containerStatuses": [container]},
        }

    def set_ready(self, name: str, namespace: str = "ns", *, ready: int | None = None) -> None:
        """Play the Deployment controller: mark Deployment `name` rolled out and ready."""
        deployment = self.objects[("Deployment", namespace, name)]
        replicas = deployment["spec"].get("replicas", 1) if ready is None else ready
        deployment["status"] = {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
        }


def _key(manifest: Manifest) -> tuple[str, str, str]:
    meta = manifest["metadata"]
    return manifest["kind"], meta["namespace"], meta["name"]


@dataclass
class FakeMetricSource:
    """A `MetricSource` answering from dicts of PromQL substrings to values (or vectors)."""

    values: dict[str, float | None] = field(default_factory=dict)
    online: bool = True
    queries: list[str] = field(default_factory=list)
    vectors: dict[str, dict[str, float]] = field(default_factory=dict)

    def query(self, promql: str) -> float | None:
        """The value of the first key contained in `promql`, else None."""
        self.queries.append(promql)
        return next((v for k, v in self.values.items() if k in promql), None)

    def query_by(self, promql: str, label: str) -> dict[str, float]:
        """The vector of the first key of `vectors` contained in `promql`, else {}."""
        self.queries.append(promql)
        return dict(next((v for k, v in self.vectors.items() if k in promql), {}))

    def is_online(self) -> bool:
        """Whether the fake is up."""
        return self.online


@dataclass
class FakeClock:
    """A settable clock for the rollout: `now` moves only when a test advances it."""

    now: datetime = field(default_factory=lambda: datetime(2026, 1, 1, tzinfo=UTC))

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward and return the new time."""
        self.now += timedelta(seconds=seconds)
        return self.now


@dataclass
class ScriptedMetricSource:
    """A `MetricSource` answering exact PromQL strings; any other query has no data.

    Queries in `failing` raise `MetricsUnavailable`, as a Prometheus error would.
    """

    values: dict[str, float | None] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    online: bool = True
    queries: list[str] = field(default_factory=list)
    vectors: dict[str, dict[str, float]] = field(default_factory=dict)

    def query(self, promql: str) -> float | None:
        """The scripted value of `promql`."""
        self.queries.append(promql)
        if promql in self.failing:
            raise MetricsUnavailable(f"scripted failure: {promql}")
        return self.values.get(promql)

    def query_by(self, promql: str, label: str) -> dict[str, float]:
        """The scripted vector of `promql` (by `label`), {} when none is scripted."""
        self.queries.append(promql)
        if promql in self.failing:
            raise MetricsUnavailable(f"scripted failure: {promql}")
        return dict(self.vectors.get(promql, {}))

    def is_online(self) -> bool:
        """Whether the fake is up."""
        return self.online


class RollingOut:
    """An InferenceService on a `FakeKube` whose version 2 has reached the first canary step.

    `spec(version)` gives the object's spec; the analysis reads `source`, time is `clock`, and
    `started` is the status at the first step (canary Ready, weight set). `reconcile` runs one
    sync the way the operator would and returns the status it wrote.
    """

    def __init__(self, spec: Callable[[str], Manifest], *, name: str) -> None:
        self.name = name
        self.kube = FakeKube()
        self.kube.add_service(make_service(spec("1"), name=name))
        self.clock = FakeClock()
        self.metrics = OperatorMetrics()
        self.source = ScriptedMetricSource()
        self.sync = Sync(
            self.kube, metrics=self.metrics, clock=lambda: self.clock.now,
            metric_source=lambda url: self.source,
        )  # fmt: skip
        self.reconcile()
        self.kube.set_ready(f"{name}-stable")
        self.reconcile()
        self.kube.objects[(naming.KIND, "ns", name)]["spec"] = spec("2")
        self.reconcile()
        self.kube.set_ready(f"{name}-canary")
        self.started = self.reconcile()

    def reconcile(self, after_s: float = 0.0) -> InferenceServiceStatus:
        """Advance the clock by `after_s`, run one sync, return the status it left."""
        self.clock.advance(after_s)
        error = self.sync.run_by_name("ns", self.name, trigger="test")
        if error is not None:
            raise AssertionError(f"the sync failed: {error}")
        return self.kube.status_of("ns", self.name)
