"""The operator's only door to the Kubernetes API: server-side apply, status, events, reads.

`handlers` calls it with plain dicts from `reconcile` and `observe`. Requests go through the
official client's `ApiClient` by path, so every kind (Deployment, Service, HTTPRoute, the
InferenceService itself) is handled the same way, without a discovery cache on disk (the
operator's root filesystem is read-only). API errors are mapped to the domain errors in
`errors` here, once: a 409 conflict is retried, 429/5xx and connection failures become
`ClusterUnavailable`, a missing HTTPRoute API becomes `DependencyMissing`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import kubernetes
import urllib3

from fleetserve_operator import naming
from fleetserve_operator.errors import ClusterUnavailable, DependencyMissing, InvalidSpec
from fleetserve_operator.observe import EventNote

__all__ = ["Cluster", "KubeApi", "ObjectRef"]

Manifest = dict[str, Any]
logger = logging.getLogger(__name__)

_PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "HTTPRoute": "httproutes",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Event": "events",
    "Pod": "pods",
    naming.KIND: naming.PLURAL,
}
_CHILD_KINDS = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
)
_CONFLICT_RETRIES = 3


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Enough of an InferenceService to address it and post Events on it."""

    namespace: str
    name: str
    uid: str


class Cluster(Protocol):
    """What `sync` needs from the API server; `KubeApi` and `testing.FakeKube` provide it."""

    def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply a child; returns the object as stored."""
        ...

    def apply_status(self, ref: ObjectRef, status: Manifest) -> None:
        """Server-side apply the InferenceService's status."""
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

    def list_children(self, namespace: str, owner: str) -> list[Manifest]:
        """The operator's children of `owner`."""
        ...

    def list_pods(self, namespace: str, owner: str) -> list[Manifest]:
        """The pods of `owner`'s tracks (for restarts and OOM kills)."""
        ...

    def remove_annotation(self, ref: ObjectRef, annotation: str) -> None:
        """Remove an annotation of the InferenceService (a command that was acted on)."""
        ...

    def post_event(self, ref: ObjectRef, note: EventNote) -> None:
        """Post an Event on the InferenceService."""
        ...


class _ApiError(Exception):
    """An HTTP error answer of the API server (internal; mapped before it leaves)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{_PLURALS[kind]}"
    return path if name is None else f"{path}/{name}"


def _owned_by(owner: str) -> str:
    """Label selector of the objects this operator manages for InferenceService `owner`."""
    return f"{naming.INSTANCE_LABEL}={owner},{naming.MANAGED_BY_LABEL}={naming.MANAGER}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeApi:
    """Synchronous API calls (kopf runs sync handlers in worker threads)."""

    def __init__(self, client: kubernetes.client.ApiClient, *, timeout_s: float = 30.0) -> None:
        self._client = client
        self._timeout_s = timeout_s

    @classmethod
    def from_environment(cls, *, timeout_s: float = 30.0) -> KubeApi:
        """In-cluster service account credentials, else the local kubeconfig ($KUBECONFIG)."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]  # untyped
                client_configuration=configuration
            )
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped
                client_configuration=configuration
            )
        return cls(kubernetes.client.ApiClient(configuration), timeout_s=timeout_s)

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
        payload: Manifest = json.loads(data) if data else {}
        if not 200 <= response.status < 300:
            raise _ApiError(response.status, str(payload.get("message", response.reason)))
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

    def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply `manifest` as field manager `fleetserve-operator` (forced)."""
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", naming.MANAGER), ("force", "true")]
        try:
            return self._call(
                "PATCH", path, body=manifest, query=query,
                content_type="application/apply-patch+yaml",
            )  # fmt: skip
        except _ApiError as exc:
            if exc.status == 404 and manifest["kind"] == "HTTPRoute":
                msg = "gateway-api needs the Gateway API CRDs (HTTPRoute v1) in the cluster"
                raise DependencyMissing("spec.traffic.provider", msg) from exc
            if exc.status == 422:
                raise InvalidSpec(
                    "spec", f"{manifest['kind']} {meta['name']}: {exc.message}"
                ) from exc
            raise ClusterUnavailable(f"apply {manifest['kind']} {meta['name']}: {exc}") from exc

    def apply_status(self, ref: ObjectRef, status: Manifest) -> None:
        """Server-side apply the InferenceService's status; fields left out are removed."""
        body = {
            "apiVersion": naming.API_VERSION,
            "kind": naming.KIND,
            "metadata": {"name": ref.name, "namespace": ref.namespace},
            "status": status,
        }
        path = _path(naming.API_VERSION, naming.KIND, ref.namespace, ref.name) + "/status"
        query = [("fieldManager", naming.MANAGER), ("force", "true")]
        try:
            self._call(
                "PATCH", path, body=body, query=query, content_type="application/apply-patch+yaml"
            )
        except _ApiError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing left to report on
                raise ClusterUnavailable(f"status of {ref.name}: {exc}") from exc

    def delete(self, manifest: Manifest) -> None:
        """Delete a child; one already gone is fine."""
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        try:
            self._call("DELETE", path, body={"propagationPolicy": "Background"})
        except _ApiError as exc:
            if exc.status != 404:
                raise ClusterUnavailable(f"delete {meta['name']}: {exc}") from exc

    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        """The InferenceService, or None when it does not exist."""
        return self._get(naming.API_VERSION, naming.KIND, namespace, name)

    def pvc_exists(self, namespace: str, claim: str) -> bool:
        """Whether PersistentVolumeClaim `claim` exists."""
        return self._get("v1", "PersistentVolumeClaim", namespace, claim) is not None

    def _get(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        try:
            return self._call("GET", _path(api_version, kind, namespace, name))
        except _ApiError as exc:
            if exc.status == 404:
                return None
            raise ClusterUnavailable(f"get {kind} {name}: {exc}") from exc

    def list_children(self, namespace: str, owner: str) -> list[Manifest]:
        """Deployments, Services and HTTPRoutes labelled as this operator's children of `owner`."""
        selector = _owned_by(owner)
        children: list[Manifest] = []
        for api_version, kind in _CHILD_KINDS:
            path = _path(api_version, kind, namespace)
            try:
                listed = self._call("GET", path, query=[("labelSelector", selector)])
            except _ApiError as exc:
                if exc.status == 404 and kind == "HTTPRoute":
                    continue  # no Gateway API in this cluster, so no routes to find
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

    def remove_annotation(self, ref: ObjectRef, annotation: str) -> None:
        """Merge-patch the annotation to null; an InferenceService already gone is fine."""
        path = _path(naming.API_VERSION, naming.KIND, ref.namespace, ref.name)
        body = {"metadata": {"annotations": {annotation: None}}}
        try:
            self._call("PATCH", path, body=body, content_type="application/merge-patch+json")
        except _ApiError as exc:
            if exc.status != 404:
                raise ClusterUnavailable(f"annotation {annotation} of {ref.name}: {exc}") from exc

    def post_event(self, ref: ObjectRef, note: EventNote) -> None:
        """Post an Event on the InferenceService; failing to is logged, never raised."""
        now = _now()
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
            "message": note.message[:1024],
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
