"""ConfigMap volumes of process pods: projected into host directories that follow updates.

A process pod has no mount namespace, so the fake kubelet does what the kubelet's ConfigMap
volume plugin does, on the host: each ``configMap`` volume the Fleetserve container mounts
becomes a directory of the pod's own (``<pod path>.volumes/<volume>``), holding one file per
key, rewritten (atomically, write then rename) when the ConfigMap changes and emptied when it
goes; an ``optional`` ConfigMap that does not exist is an empty directory. The container's
args that name a path under a mount are pointed at the host directory instead
(`host_args`), as the pod's paths would resolve inside its mount namespace.

The harness has no cluster DNS either. A value naming a Service by its cluster name
(``http://<service>.<namespace>.svc[.cluster.local][:port]``, as the operator writes a shadow
target) is projected with that authority replaced by a ready pod of the Service
(`resolve_services`), chosen again at every sync, as kube-proxy would route a new connection;
a Service with no ready pod is left as written, so a client fails to connect, as it would
in a cluster with no endpoints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetserve_e2e.kubeapi import JsonObject

__all__ = [
    "ConfigMapMount",
    "config_map_mounts",
    "host_args",
    "project",
    "resolve_services",
]

_SERVICE_URL = re.compile(
    r"(?P<scheme>https?)://(?P<service>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\."
    r"(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?(:(?P<port>[0-9]+))?"
)


@dataclass(frozen=True)
class ConfigMapMount:
    """One ``configMap`` volume the container mounts, and where it lives on the host."""

    config_map: str
    mount_path: str
    optional: bool
    host_dir: Path


def config_map_mounts(
    pod: JsonObject, container: JsonObject, volumes_dir: Path
) -> list[ConfigMapMount]:
    """The container's ``configMap`` mounts, each at ``volumes_dir/<volume name>`` on the host."""
    by_name = {
        volume["name"]: volume["configMap"]
        for volume in pod["spec"].get("volumes", [])
        if "configMap" in volume
    }
    return [
        ConfigMapMount(
            config_map=by_name[mount["name"]]["name"],
            mount_path=mount["mountPath"].rstrip("/"),
            optional=bool(by_name[mount["name"]].get("optional", False)),
            host_dir=volumes_dir / mount["name"],
        )
        for mount in container.get("volumeMounts", [])
        if mount["name"] in by_name
    ]


def host_args(args: Sequence[str], mounts: Sequence[ConfigMapMount]) -> list[str]:
    """`args` with every path under a mount (``/mount/x``, ``--flag=/mount/x``) on the host."""

    def moved(arg: str) -> str:
        flag, equals, value = arg.rpartition("=") if arg.startswith("--") else ("", "", arg)
        for mount in mounts:
            if value == mount.mount_path or value.startswith(f"{mount.mount_path}/"):
                value = str(mount.host_dir) + value[len(mount.mount_path) :]
                break
        return f"{flag}{equals}{value}"

    return [moved(arg) for arg in args]


def resolve_services(text: str, endpoint: Callable[[str, str], str | None]) -> str:
    """`text` with each Service URL's authority replaced by ``endpoint(namespace, service)``.

    `endpoint` returns ``<ip>:<port>`` of a ready pod of the Service, or None (left as is).
    The scheme is kept: a pod serving TLS is reached over TLS.
    """

    def replaced(found: re.Match[str]) -> str:
        address = endpoint(found["namespace"], found["service"])
        return found[0] if address is None else f"{found['scheme']}://{address}"

    return _SERVICE_URL.sub(replaced, text)


def project(mount: ConfigMapMount, data: Mapping[str, str] | None) -> bool:
    """Make `mount.host_dir` hold `data` (a ConfigMap's, None: it is gone); True if it changed.

    Each file is replaced atomically, so a reader never sees half a file; keys no longer in
    the ConfigMap are removed.
    """
    mount.host_dir.mkdir(parents=True, exist_ok=True)
    wanted = dict(data or {})
    changed = False
    for stale in sorted(mount.host_dir.iterdir()):
        if stale.name not in wanted and not stale.name.startswith("."):
            stale.unlink()
            changed = True
    for key, value in wanted.items():
        path = mount.host_dir / key
        if path.is_file() and path.read_text(encoding="utf-8") == value:
            continue
        partial = mount.host_dir / f".{key}.partial"
        partial.write_text(value, encoding="utf-8")
        os.replace(partial, path)
        changed = True
    return changed
