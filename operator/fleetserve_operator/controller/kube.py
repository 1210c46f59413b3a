"""The operator's only door to the Kubernetes API: server-side apply, status, events, reads.

`sync` calls it with plain dicts rendered by `render` and `observe`. Requests go through the
official client's `ApiClient` by path, so every kind (Deployment, Service, HTTPRoute, the
InferenceService itself) is handled the same way, without a discovery cache on disk (the
operator's root filesystem is read-only). API errors are mapped to the domain errors in
`errors` here, once: a 409 conflict is retried, 429/5xx and connection failures become
`ClusterUnavailable`, a missing HTTPRoute or ScaledObject API becomes `DependencyMissing`
naming the spec field that asked for it, a child the API server refuses (schema, admission,
quota) becomes `ChildRefused`. What the API server says is cut at `errors.MESSAGE_LIMIT` as
it arrives: it reaches status, Events and logs, and a refusal may quote the whole object.

Children are never written blind. `create` is create-only (a POST, refused when the name is
taken, so an object that appeared since `sync` looked is never overwritten or shared);
`apply` names the uid of the object `sync` checked, so the API server refuses it if that
object was replaced meanwhile. The first apply onto a created child takes over the fields
its create set (`_take_ownership`), so from then on the operator owns exactly the fields it
applies.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import kubernetes
import urllib3

from fleetserve_operator import naming
from fleetserve_operator.errors import (
    ChildConflict,
    ChildRefused,
    ClusterUnavailable,
    DependencyMissing,
    bounded,
)
from fleetserve_operator.records import EventNote, Manifest, rfc3339

__all__ = ["Cluster", "KubeApi", "ObjectRef", "as_applied"]

logger = logging.getLogger(__name__)

_PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "ConfigMap": "configmaps",
    "HTTPRoute": "httproutes",
    "GRPCRoute": "grpcroutes",
    "ScaledObject": "scaledobjects",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Secret": "secrets",
    "Event": "events",
    "Pod": "pods",
    naming.KIND: naming.PLURAL,
}
_CHILD_KINDS = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ("gateway.networking.k8s.io/v1", "GRPCRoute"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("policy/v1", "PodDisruptionBudget"),
)
# Kinds from CRDs a cluster may lack: nothing of them to list, and a write names the field
# that asked for one.
_OPTIONAL_KINDS = {
    "HTTPRoute": (
        "spec.traffic.provider",
        "gateway-api needs the Gateway API CRDs (HTTPRoute v1) in the cluster",
    ),
    # GRPCRoute reached v1 after HTTPRoute: a cluster may serve one without the other.
    "GRPCRoute": (
        "spec.runtime.grpc",
        "gRPC with gateway-api needs the Gateway API's GRPCRoute CRD (v1, Gateway API 1.1 "
        "or later) in the cluster",
    ),
    "ScaledObject": (
        "spec.scaling",
        "autoscaling needs KEDA: its ScaledObject CRD (keda.sh/v1alpha1) is not in the cluster",
    ),
}
_ABSENT_RECHECK_S = 60.0
"""How long a kind whose CRD answered 404 is not listed again: every reconcile lists every
child kind, and without Gateway API or KEDA three of its six lists were 404s (a fifth of all
the operator's requests at 1000 services). The child watches look for a new CRD as often."""
_CONFLICT_RETRIES = 3
# What the API server says when it refuses a write for its content (schema, admission,
# quota), as opposed to failing: 400 BadRequest, 403 Forbidden, 422 Invalid.
_REFUSALS = (400, 403, 422)
_DRY_RUN = [("dryRun", "All")]
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
"""A server-side apply's request body."""
_MERGE_PATCH = "application/merge-patch+json"
# The spec section a child is rendered from, for the field a refusal names.
_SOURCE_FIELDS = {
    "HTTPRoute": "spec.traffic",
    "GRPCRoute": "spec.traffic",
    "Service": "spec.traffic",
    "ScaledObject": "spec.scaling",
    "PodDisruptionBudget": "spec.disruption",
    "ConfigMap": "spec.rollout.shadow",
}


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Enough of an InferenceService to address it and post Events on it."""

    namespace: str
    name: str
    uid: str


class Cluster(Protocol):
    """What `sync` needs from the API server; `KubeApi` and `testing.FakeKube` provide it."""

    def get_child(self, manifest: Manifest) -> Manifest | None:
        """The object `manifest` names (kind, namespace, name), whoever owns it; or None."""
        ...

    def validate(self, manifest: Manifest, *, current: Manifest | None) -> None:
        """Dry-run the write that `create` (`current` None) or `apply` would make.

        Raises:
            ChildConflict: (a create's) an object of that name exists.
            ChildRefused: the API server refused it (naming the child and its message).
        """
        ...

    def create(self, manifest: Manifest) -> Manifest:
        """Create a child that does not exist; returns it as stored.

        Raises:
            ChildConflict: an object of that name exists (it is left untouched).
        """
        ...

    def apply(self, manifest: Manifest, *, current: Manifest) -> Manifest:
        """Server-side apply a child onto `current` (the object as checked); returns it."""
        ...

    def apply_status(self, ref: ObjectRef, status: Manifest) -> Manifest | None:
        """Server-side apply the InferenceService's status; returns the service as written.

        None when the service is gone.
        """
        ...

    def delete(self, manifest: Manifest) -> None:
        """Delete a child (absent is fine)."""
        ...

    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        """The InferenceService, or None."""
        ...

    def pvc_exists(self, namespace: str, claim: str) -> bool:
        """Whether the PersistentVolumeClaim exists."""
        ...

    def read_secret(self, namespace: str, name: str, key: str) -> bytes | None:
        """The value of `key` in Secret `name` (a webhook's HMAC key); None when absent."""
        ...

    def list_children(self, namespace: str, owner: str) -> list[Manifest]:
        """The operator's children of `owner`."""
        ...

    def list_pods(self, namespace: str, owner: str) -> list[Manifest]:
        """The pods of `owner`'s tracks (for restarts and OOM kills)."""
        ...

    def remove_annotation(self, ref: ObjectRef, annotation: str) -> Manifest | None:
        """Remove an annotation of the InferenceService (a command that was acted on).

        Returns the service as written; None when it is gone.
        """
        ...

    def remove_finalizer(self, service: Manifest, finalizer: str) -> Manifest | None:
        """Take `finalizer` off the InferenceService `service` (as last read).

        Returns the service as written; None when it is gone.
        """
        ...

    def post_event(self, ref: ObjectRef, note: EventNote) -> None:
        """Post an Event on the InferenceService."""
        ...


class _ApiError(Exception):
    """An HTTP error answer of the API server (internal; mapped before it leaves)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = bounded(message)
        super().__init__(f"{status}: {self.message}")


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{_PLURALS[kind]}"
    return path if name is None else f"{path}/{name}"


def _error_message(data: bytes, reason: str) -> str:
    """The `message` of an error answer's Status, else its HTTP reason.

    A path under an API group the cluster does not serve (no KEDA, no Gateway API) is
    answered with a plain-text `404 page not found`, not a Status.
    """
    try:
        status = json.loads(data) if data else {}
    except ValueError:
        return reason
    return str(status.get("message", reason)) if isinstance(status, dict) else reason


def _owned_by(owner: str) -> str:
    """Label selector of the objects this operator manages for InferenceService `owner`."""
    return f"{naming.INSTANCE_LABEL}={owner},{naming.MANAGED_BY_LABEL}={naming.MANAGER}"


def _entries(obj: Manifest) -> list[Manifest]:
    entries: list[Manifest] = obj["metadata"].get("managedFields") or []
    return entries


def _owns_fields(entry: Manifest, api_version: str) -> bool:
    """Whether `entry` is the operator's for the object's own fields at `api_version`."""
    return (
        entry.get("manager") == naming.MANAGER
        and entry.get("apiVersion") == api_version
        and not entry.get("subresource")
    )


def _created_not_applied(obj: Manifest, api_version: str) -> bool:
    """Whether the operator owns fields of `obj` by an entry `as_applied` makes its `Apply`."""
    return any(
        _owns_fields(entry, api_version) and entry.get("operation") == "Update"
        for entry in _entries(obj)
    )


def as_applied(entries: list[Manifest], api_version: str) -> list[Manifest]:
    """`entries` with the operator's entries for `api_version` made one `Apply` entry.

    It owns every field they owned; the other managers' entries are kept as they are.
    """
    ours = [entry for entry in entries if _owns_fields(entry, api_version)]
    fields: Manifest = {}
    for entry in ours:
        _own(fields, entry.get("fieldsV1") or {})
    applied = {
        "manager": naming.MANAGER,
        "operation": "Apply",
        "apiVersion": api_version,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    return [applied, *(entry for entry in entries if entry not in ours)]


def _own(fields: Manifest, more: Manifest) -> None:
    """Add the field set `more` (managedFields' FieldsV1 form) to `fields`, in place."""
    for key, below in more.items():
        _own(fields.setdefault(key, {}), below)


class KubeApi:
    """Synchronous API calls (kopf runs sync handlers in worker threads)."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._clock = clock
        self._absent_until: dict[str, float] = {}
        """Optional kinds last answered 404, with when to list them again (`_ABSENT_RECHECK_S`)."""

    @classmethod
    def from_environment(cls, *, timeout_s: float = 30.0, connections: int = 10) -> KubeApi:
        """In-cluster service account credentials, else the local kubeconfig ($KUBECONFIG).

        `connections`: the connections kept open to the API server, one for every thread
        that may wait on it at once (each watch holds one for as long as it runs). Past
        that, every request opens a new connection, TLS handshake included, and drops it.
        """
        configuration = kubernetes.client.Configuration()
        configuration.connection_pool_maxsize = connections
        try:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]  # untyped
                client_configuration=configuration
            )
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped
                client_configuration=configuration
            )
        # Both loaders refresh the token before every request and set the host again, and
        # each time the host is set the client looks the environment's proxy up again:
        # about 2 % of the operator's CPU at 1000 services. Set once, as it is now, the
        # proxy is the one every request already used (the connection pool was made with it).
        configuration.proxy = configuration.proxy
        return cls(kubernetes.client.ApiClient(configuration), timeout_s=timeout_s)

    @property
    def api_client(self) -> kubernetes.client.ApiClient:
        """The authenticated client, for the child watches (`child_watch`)."""
        return self._client

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Manifest:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        request = self._client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        try:
            response = self._client.call_api(*request, _request_timeout=self._timeout_s)
            data = response.read()  # type: ignore[no-untyped-call]  # untyped upstream
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnavailable(f"{method} {path}: {exc}") from exc
        if not 200 <= response.status < 300:
            raise _ApiError(response.status, _error_message(data, response.reason))
        payload: Manifest = json.loads(data) if data else {}
        return payload

    def _call(self, method: str, path: str, **kwargs: Any) -> Manifest:
        """`_send` with 409 conflicts retried and transient failures mapped."""
        for attempt in range(_CONFLICT_RETRIES):
            try:
                return self._send(method, path, **kwargs)
            except _ApiError as exc:
                if exc.status == 409 and attempt + 1 < _CONFLICT_RETRIES:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                if exc.status in (409, 429) or exc.status >= 500:
                    raise ClusterUnavailable(f"{method} {path}: {exc}") from exc
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def get_child(self, manifest: Manifest) -> Manifest | None:
        """The object `manifest` names, or None (also when the HTTPRoute API is missing)."""
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        try:
            return self._call("GET", path)
        except _ApiError as exc:
            if exc.status == 404:
                return None
            raise ClusterUnavailable(f"get {manifest['kind']} {meta['name']}: {exc}") from exc

    def validate(self, manifest: Manifest, *, current: Manifest | None) -> None:
        """Dry-run (`dryRun=All`) the write `create` or `apply` would make.

        The API server validates and admits it as that write, and stores nothing.

        Raises:
            ChildConflict: a create's name is taken by a stored object.
            ChildRefused: the API server refused the write.
            DependencyMissing: the child's API (Gateway API, KEDA) is not served.
        """
        if current is None:
            self._post(manifest, _DRY_RUN)
        else:
            self._apply(manifest, current["metadata"]["uid"], _DRY_RUN)

    def create(self, manifest: Manifest) -> Manifest:
        """Create `manifest` by a POST; returns it as stored.

        A POST is create-only: where any object holds the name, whatever it holds, it is
        refused with 409 and that object is left as it was. It is also the API server's
        cheapest write of a new object: a create-only server-side apply cost it about 6 ms
        of CPU more per child. The operator is then the `Update` owner of every field the
        POST set, defaults included, until its first apply onto the child takes them over
        (`_take_ownership`); most children are never applied onto.

        Raises:
            ChildConflict: the name is taken.
        """
        return self._post(manifest, [])

    def _post(self, manifest: Manifest, query: list[tuple[str, str]]) -> Manifest:
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"])
        try:
            # Not `_call`: a 409 here is a name taken, which no retry changes.
            created = self._send(
                "POST", path, body=manifest, query=[("fieldManager", naming.MANAGER), *query]
            )
        except _ApiError as exc:
            if exc.status == 409:
                raise ChildConflict(manifest["kind"], meta["namespace"], meta["name"]) from exc
            raise self._write_error(manifest, exc) from exc
        self._served(manifest["kind"])
        return created

    def apply(self, manifest: Manifest, *, current: Manifest) -> Manifest:
        """Server-side apply as field manager `fleetserve-operator` (forced) onto `current`."""
        if _created_not_applied(current, manifest["apiVersion"]):
            self._take_ownership(manifest, current)
        return self._apply(manifest, current["metadata"]["uid"], [])

    def _take_ownership(self, manifest: Manifest, current: Manifest) -> None:
        """Make the operator's `Update` entry on the child `current` its `Apply` entry.

        A create leaves the operator the `Update` owner of every field it set, and an apply
        removes only the fields its manager's `Apply` entry owned: without this, a field the
        operator stops applying would stay. Once the `Apply` entry owns them, the apply
        removes what it no longer names, and a default it never named is set again by the
        API server as on a create (both checked on the real API server). The entries are
        read fresh (the child cache keeps only the operator's) and written back under the
        child's resourceVersion, so another manager's entry written in between is never
        lost: a conflict reads them again. The apply's dry-run (`validate`) ran before this,
        so it checked the apply without the removals; those are fields the operator itself
        set and no longer renders.
        """
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        for attempt in range(_CONFLICT_RETRIES):
            stored = self.get_child(manifest)
            if stored is None or stored["metadata"]["uid"] != current["metadata"]["uid"]:
                raise ClusterUnavailable(f"{kind} {name} was replaced or deleted; retried")
            meta = stored["metadata"]
            entries = as_applied(_entries(stored), manifest["apiVersion"])
            patch = {
                "metadata": {"managedFields": entries, "resourceVersion": meta["resourceVersion"]}
            }
            path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
            try:
                self._send("PATCH", path, body=patch, content_type=_MERGE_PATCH)
                return
            except _ApiError as exc:
                if exc.status == 409 and attempt + 1 < _CONFLICT_RETRIES:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                if exc.status in (404, 409):
                    msg = f"{kind} {name} kept changing or went away while taken over; retried"
                    raise ClusterUnavailable(msg) from exc
                raise self._write_error(manifest, exc) from exc

    def _write_error(self, manifest: Manifest, exc: _ApiError) -> Exception:
        """The domain error for a refused or failed write of a child."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if exc.status == 404 and kind in _OPTIONAL_KINDS:
            return DependencyMissing(*_OPTIONAL_KINDS[kind])
        if exc.status in _REFUSALS:
            field = _SOURCE_FIELDS.get(kind, "spec")
            return ChildRefused(field, kind, name, exc.message)
        return ClusterUnavailable(f"write {kind} {name}: {exc}")

    def _apply(self, manifest: Manifest, uid: str | None, query: list[tuple[str, str]]) -> Manifest:
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        # With a uid the API server refuses the apply if that object was replaced or deleted.
        body = manifest if uid is None else {**manifest, "metadata": {**meta, "uid": uid}}
        query = [("fieldManager", naming.MANAGER), ("force", "true"), *query]
        try:
            applied = self._call(
                "PATCH", path, body=body, query=query,
                content_type=APPLY_CONTENT_TYPE,
            )  # fmt: skip
        except _ApiError as exc:
            raise self._write_error(manifest, exc) from exc
        self._served(manifest["kind"])
        return applied

    def _served(self, kind: str) -> None:
        """`kind` was written: served after all if a list found its CRD missing; list it again."""
        self._absent_until.pop(kind, None)

    def apply_status(self, ref: ObjectRef, status: Manifest) -> Manifest | None:
        """Server-side apply the InferenceService's status; fields left out are removed.

        Returns the service as the API server answered; None when it is gone.
        """
        body = {
            "apiVersion": naming.API_VERSION,
            "kind": naming.KIND,
            "metadata": {"name": ref.name, "namespace": ref.namespace},
            "status": status,
        }
        path = _path(naming.API_VERSION, naming.KIND, ref.namespace, ref.name) + "/status"
        query = [("fieldManager", naming.MANAGER), ("force", "true")]
        try:
            return self._call(
                "PATCH", path, body=body, query=query, content_type=APPLY_CONTENT_TYPE
            )
        except _ApiError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing left to report on
                raise ClusterUnavailable(f"status of {ref.name}: {exc}") from exc
        return None

    def delete(self, manifest: Manifest) -> None:
        """Delete a child; one already gone, or replaced since it was read, is fine.

        With the uid `manifest` was read or created with, the API server deletes that
        object only (409 where another now holds the name): never one made in its place.
        """
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        body: Manifest = {"propagationPolicy": "Background"}
        if meta.get("uid"):
            body["preconditions"] = {"uid": meta["uid"]}
        try:
            # Not `_call`: a 409 here is the uid's precondition failing, which no retry changes.
            self._send("DELETE", path, body=body)
        except _ApiError as exc:
            if exc.status not in (404, 409):
                raise ClusterUnavailable(f"delete {meta['name']}: {exc}") from exc

    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        """The InferenceService, or None when it does not exist."""
        return self._get(naming.API_VERSION, naming.KIND, namespace, name)

    def pvc_exists(self, namespace: str, claim: str) -> bool:
        """Whether PersistentVolumeClaim `claim` exists."""
        return self._get("v1", "PersistentVolumeClaim", namespace, claim) is not None

    def read_secret(self, namespace: str, name: str, key: str) -> bytes | None:
        """The decoded value of `key` in Secret `name`; None when the Secret or key is absent."""
        secret = self._get("v1", "Secret", namespace, name)
        value = (secret or {}).get("data", {}).get(key)
        return None if value is None else base64.b64decode(value)

    def _get(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        try:
            return self._call("GET", _path(api_version, kind, namespace, name))
        except _ApiError as exc:
            if exc.status == 404:
                return None
            raise ClusterUnavailable(f"get {kind} {name}: {exc}") from exc

    def list_children(self, namespace: str, owner: str) -> list[Manifest]:
        """Every `_CHILD_KINDS` object labelled as this operator's children of `owner`.

        A kind whose CRD was missing is skipped for `_ABSENT_RECHECK_S`, or until the
        operator writes one (the CRD is there after all).
        """
        selector = _owned_by(owner)
        children: list[Manifest] = []
        for api_version, kind in _CHILD_KINDS:
            if self._absent_until.get(kind, 0.0) > self._clock():
                continue  # its CRD was missing moments ago, so there is none to find
            path = _path(api_version, kind, namespace)
            try:
                listed = self._call("GET", path, query=[("labelSelector", selector)])
            except _ApiError as exc:
                if exc.status == 404 and kind in _OPTIONAL_KINDS:
                    self._absent_until[kind] = self._clock() + _ABSENT_RECHECK_S
                    continue  # its CRD is not in this cluster, so there is none to find
                raise ClusterUnavailable(f"list {kind}: {exc}") from exc
            children += [
                {"apiVersion": api_version, "kind": kind, **item} for item in listed["items"]
            ]
        return children

    def list_pods(self, namespace: str, owner: str) -> list[Manifest]:
        """The pods labelled as `owner`'s (they carry their Deployment's labels)."""
        path = _path("v1", "Pod", namespace)
        try:
            listed = self._call("GET", path, query=[("labelSelector", _owned_by(owner))])
        except _ApiError as exc:
            raise ClusterUnavailable(f"list pods of {owner}: {exc}") from exc
        items: list[Manifest] = listed["items"]
        return items

    def remove_annotation(self, ref: ObjectRef, annotation: str) -> Manifest | None:
        """Merge-patch the annotation to null; an InferenceService already gone is fine.

        Returns the service as the API server answered; None when it is gone.
        """
        body = {"metadata": {"annotations": {annotation: None}}}
        return self._patch_service(
            ref.namespace, ref.name, body, "merge", what=f"annotation {annotation}"
        )

    def remove_finalizer(self, service: Manifest, finalizer: str) -> Manifest | None:
        """JSON-patch `finalizer` out of the list, testing it is still where it was read.

        Another controller's finalizer added or removed meanwhile fails the test (422): the
        next reconcile, reading the list again, tries again.
        """
        meta = service["metadata"]
        index = meta["finalizers"].index(finalizer)
        patch = [
            {"op": "test", "path": f"/metadata/finalizers/{index}", "value": finalizer},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"},
        ]
        return self._patch_service(meta["namespace"], meta["name"], patch, "json", "finalizer")

    def _patch_service(
        self, namespace: str, name: str, patch: object, kind: str, what: str
    ) -> Manifest | None:
        """PATCH the InferenceService (`kind`: "merge" or "json"); None when it is gone."""
        path = _path(naming.API_VERSION, naming.KIND, namespace, name)
        content_type = f"application/{kind}-patch+json"
        try:
            return self._call("PATCH", path, body=patch, content_type=content_type)
        except _ApiError as exc:
            if exc.status != 404:
                raise ClusterUnavailable(f"{what} of {name}: {exc}") from exc
        return None

    def post_event(self, ref: ObjectRef, note: EventNote) -> None:
        """Post an Event on the InferenceService; failing to is logged, never raised."""
        now = rfc3339(datetime.now(UTC))
        event = {
            "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": naming.API_VERSION,
                "kind": naming.KIND,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
            "type": note.type,
            "reason": note.reason,
            "message": bounded(note.message),
            "source": {"component": naming.MANAGER},
            "reportingComponent": naming.MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._call("POST", _path("v1", "Event", ref.namespace), body=event)
        except (_ApiError, ClusterUnavailable) as exc:
            logger.warning("could not post event %s on %s: %s", note.reason, ref.name, exc)
