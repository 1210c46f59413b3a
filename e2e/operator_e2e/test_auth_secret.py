"""`spec.runtime.authSecretRef` on a real API server: the pods mount the token's Secret.

The harness mounts no volumes (e2e/README.md), so a runtime started with `--auth-token-file`
cannot read its token here; what is checked is what the API server and the cluster's
controllers accept and make of the operator's Deployment: pods whose spec mounts the Secret
read-only as a directory (so the kubelet updates a rotated token) and pass its file.
"""

from __future__ import annotations

from typing import Any

from fleetserve_e2e import KubeClient
from fleetserve_e2e.operator_process import OperatorProcess, fsvc_path
from fleetserve_e2e.operator_testing import synthetic_service
from fleetserve_e2e.testing import list_pods
from fleetserve_e2e.waiting import wait_until

NAME = "secured"
MOUNT = "/var/run/secrets/fleetserve/auth"


def test_pods_mount_the_token_secret_read_only(
    kube: KubeClient, namespace: str, operator: OperatorProcess
) -> None:
    """The stable pods carry the Secret volume, a read-only directory mount and the flag."""
    kube.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {"metadata": {"name": "tokens"}, "stringData": {"current": "s3cret"}},
    )
    auth = {"authSecretRef": {"name": "tokens", "key": "current"}}
    manifest = synthetic_service(NAME)
    manifest["spec"]["runtime"] |= auth
    kube.create(fsvc_path(namespace), manifest)

    pod: dict[str, Any] = wait_until(
        lambda: next(iter(list_pods(kube, namespace)), None),
        timeout_s=60.0,
        what="a pod of the stable track",
    )
    spec = pod["spec"]
    volume = next(v for v in spec["volumes"] if "secret" in v)
    assert volume["secret"]["secretName"] == "tokens"
    assert volume["secret"]["items"] == [{"key": "current", "path": "token"}]
    container = spec["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert (mount["mountPath"], mount.get("readOnly"), mount.get("subPath")) == (MOUNT, True, None)
    args = container["args"]
    assert args[args.index("--auth-token-file") + 1] == f"{MOUNT}/token"
