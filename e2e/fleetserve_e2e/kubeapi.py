"""A small typed Kubernetes REST client over httpx, for the harness and its tests.

The harness needs only a handful of verbs (get, list, create, patch, delete, watch) on a few
resources; a thin client keeps the harness free of the untyped ``kubernetes`` package and lets
tests see the API server's own error messages verbatim.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from fleetserve_e2e.pki import ClusterPki

JsonObject = dict[str, Any]
_TIMEOUT_S = 30.0


class KubeApiError(Exception):
    """The API server answered with an error status; ``message`` is its own text."""

    def __init__(self, status_code: int, message: str, reason: str) -> None:
        """Keep the HTTP status, the Status ``reason`` and the server's message."""
        super().__init__(f"{status_code} {reason}: {message}")
        self.status_code = status_code
        self.message = message
        self.reason = reason


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch stream: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""

    type: str
    object: JsonObject


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = response.json()
    except json.JSONDecodeError:
        body = {"message": response.text, "reason": response.reason_phrase}
    raise KubeApiError(response.status_code, body.get("message", ""), body.get("reason", ""))


class KubeClient:
    """Admin client for one API server, authenticated with a client certificate."""

    def __init__(self, server: str, pki: ClusterPki) -> None:
        """Connect to ``server`` (an https URL) with the cluster's admin certificate."""
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        # trust_env=False: a proxy from the environment must never see loopback API traffic.
        self._http = httpx.Client(
            base_url=server, verify=context, timeout=_TIMEOUT_S, trust_env=False
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        """Send one request and return the decoded JSON answer.

        Raises:
            KubeApiError: The server answered with a non-2xx status.
        """
        response = self._http.request(
            method,
            path,
            content=None if body is None else json.dumps(body),
            params=params,
            headers={"Content-Type": content_type},
        )
        _raise_for_status(response)
        result: JsonObject = response.json()
        return result

    def get(self, path: str, params: Mapping[str, str] | None = None) -> JsonObject:
        """GET an object or a list."""
        return self.request("GET", path, params=params)

    def create(self, path: str, body: Mapping[str, Any]) -> JsonObject:
        """POST a new object into the collection at ``path``."""
        return self.request("POST", path, body=body)

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> JsonObject:
        """Apply a JSON merge patch (RFC 7386) to the object at ``path``."""
        return self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Mapping[str, Any] | None = None) -> JsonObject:
        """DELETE the object at ``path`` (with optional DeleteOptions)."""
        return self.request("DELETE", path, body=body)

    def get_text(self, path: str) -> str:
        """GET a non-JSON endpoint such as ``/readyz``."""
        response = self._http.get(path)
        _raise_for_status(response)
        return response.text

    def watch(self, path: str, resource_version: str, timeout_s: int = 60) -> Iterator[WatchEvent]:
        """Stream watch events for the collection at ``path`` from ``resource_version``.

        The server ends the stream after ``timeout_s`` seconds; callers re-watch from the last
        resourceVersion they saw, like client-go's reflector.
        """
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        timeout = httpx.Timeout(_TIMEOUT_S, read=timeout_s + _TIMEOUT_S)
        with self._http.stream("GET", path, params=params, timeout=timeout) as response:
            if not response.is_success:
                response.read()
                _raise_for_status(response)
            for line in response.iter_lines():
                if line:
                    event = json.loads(line)
                    yield WatchEvent(type=event["type"], object=event["object"])


def namespaced(resource: str, namespace: str, name: str = "", *, group_version: str = "") -> str:
    """Return the REST path of a namespaced resource (core API when ``group_version`` is empty)."""
    prefix = f"/apis/{group_version}" if group_version else "/api/v1"
    path = f"{prefix}/namespaces/{namespace}/{resource}"
    return f"{path}/{name}" if name else path
