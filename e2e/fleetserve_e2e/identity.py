"""A process's way into the cluster: the ServiceAccount it runs as, and nothing else.

A kubelet gives a container its identity through a projected token volume; the harness runs
processes on the host, where the test's own environment would offer more (an admin
``KUBECONFIG``, in-cluster variables, proxies).  Here a process gets a clean environment
(:func:`isolated_env`) and a kubeconfig holding only a TokenRequest token of its account
(:func:`request_token`, :func:`write_token_kubeconfig`).  Callers: the fake kubelet
(``pod_runner``) for pods that mount a token, and ``operator_process`` for the operator it runs
outside a pod; both prove that the RBAC they were given suffices.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetserve_e2e.kubeapi import JsonObject, KubeClient, namespaced

# In-cluster config (KUBERNETES_SERVICE_HOST/PORT), an admin kubeconfig or a proxy would let a
# process reach the API server as someone other than its ServiceAccount; FLEETSERVE_* settings
# must come from the pod spec (or the caller), not from whoever ran the tests.
_DROPPED_PREFIXES = ("KUBERNETES_", "FLEETSERVE_")
_DROPPED = frozenset({"KUBECONFIG", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"})
# What the ServiceAccount admission plugin sets when a projected token names none.
_DEFAULT_TOKEN_EXPIRATION_S = 3607


def isolated_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Return `environ` without cluster credentials, proxies or ``FLEETSERVE_*`` settings.

    Names are compared case-insensitively, as ``http_proxy`` works as well as ``HTTP_PROXY``.
    """
    return {
        key: value
        for key, value in environ.items()
        if key.upper() not in _DROPPED and not key.upper().startswith(_DROPPED_PREFIXES)
    }


@dataclass(frozen=True)
class ProjectedToken:
    """The service-account token a pod mounts, as its projected volume asks for it."""

    account: str
    expiration_s: int
    audiences: tuple[str, ...]


def projected_token(pod: JsonObject) -> ProjectedToken | None:
    """Return the token the pod mounts, or None when it mounts none.

    The ServiceAccount admission plugin adds the projected ``serviceAccountToken`` volume
    exactly when the pod has an account and neither the pod nor the account sets
    ``automountServiceAccountToken: false``, so the volume is what decides, as for a kubelet.
    """
    spec = pod["spec"]
    for volume in spec.get("volumes", []):
        for source in volume.get("projected", {}).get("sources", []):
            token = source.get("serviceAccountToken")
            if token is not None:
                audience = token.get("audience")
                return ProjectedToken(
                    account=spec.get("serviceAccountName", "default"),
                    expiration_s=int(token.get("expirationSeconds", _DEFAULT_TOKEN_EXPIRATION_S)),
                    audiences=(audience,) if audience else (),
                )
    return None


def request_token(
    kube: KubeClient,
    *,
    namespace: str,
    account: str,
    expiration_s: int,
    audiences: Sequence[str] = (),
    bound_pod: JsonObject | None = None,
) -> str:
    """Request a token for `namespace`/`account` through the TokenRequest API.

    With `bound_pod` the token is bound to that pod (by name and uid), as a kubelet's is: the
    API server stops accepting it once the pod is gone.  No audiences means the API server's.
    """
    spec: JsonObject = {"expirationSeconds": expiration_s, "audiences": list(audiences)}
    if bound_pod is not None:
        meta = bound_pod["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = f"{namespaced('serviceaccounts', namespace, account)}/token"
    token: str = kube.create(path, request)["status"]["token"]
    return token


def write_token_kubeconfig(path: Path, *, server: str, ca_cert: Path, token: str) -> Path:
    """Write a kubeconfig holding `server`, the cluster CA and `token` only; return `path`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}
        ],
        "users": [{"name": "service-account", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "service-account"}}],
        "current-context": "e2e",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    # Owner-only before the token is written, so it is never readable by others.
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path
