"""ConfigMap volumes of process pods: host directories that follow, Service URLs resolved."""

from __future__ import annotations

from pathlib import Path

from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pod_volumes import (
    config_map_mounts,
    host_args,
    project,
    resolve_services,
)

POD: JsonObject = {
    "spec": {
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "shadow-target", "configMap": {"name": "demo-shadow", "optional": True}},
        ]
    }
}
CONTAINER: JsonObject = {
    "volumeMounts": [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shadow-target", "mountPath": "/etc/fleetserve/shadow/", "readOnly": True},
    ]
}


def test_only_config_map_mounts_are_projected_and_args_follow_them(tmp_path: Path) -> None:
    """A path under the mount, alone or after `=`, moves to the host; a lookalike does not."""
    (mount,) = config_map_mounts(POD, CONTAINER, tmp_path)
    assert (mount.config_map, mount.mount_path, mount.optional) == (
        "demo-shadow",
        "/etc/fleetserve/shadow",
        True,
    )
    assert mount.host_dir == tmp_path / "shadow-target"
    args = [
        "--shadow-file",
        "/etc/fleetserve/shadow/target.json",
        "--shadow-file=/etc/fleetserve/shadow/target.json",
        "/etc/fleetserve/shadowy",
        "--port",
        "8080",
    ]
    assert host_args(args, [mount]) == [
        "--shadow-file",
        f"{tmp_path}/shadow-target/target.json",
        f"--shadow-file={tmp_path}/shadow-target/target.json",
        "/etc/fleetserve/shadowy",
        "--port",
        "8080",
    ]


def test_a_projection_follows_the_config_map(tmp_path: Path) -> None:
    """Keys written when they change, removed when they go; an absent ConfigMap is empty."""
    (mount,) = config_map_mounts(POD, CONTAINER, tmp_path)
    assert not project(mount, None)
    assert list(mount.host_dir.iterdir()) == []  # an optional one that does not exist
    assert project(mount, {"target.json": "{}", "other": "x"})
    assert not project(mount, {"target.json": "{}", "other": "x"})
    assert project(mount, {"target.json": ""})
    assert sorted(p.name for p in mount.host_dir.iterdir()) == ["target.json"]
    assert (mount.host_dir / "target.json").read_text() == ""


def test_service_urls_resolve_to_a_ready_pod_or_stay() -> None:
    """Cluster names of Services with a ready pod become its address; others stay."""

    def endpoint(namespace: str, service: str) -> str | None:
        return "127.0.0.1:4242" if (namespace, service) == ("ns", "demo-canary") else None

    text = (
        '{"url": "http://demo-canary.ns.svc:80", "b": "https://demo-canary.ns.svc.cluster.local",'
        ' "c": "http://gone.ns.svc:80/x", "d": "http://example.com"}'
    )
    assert resolve_services(text, endpoint) == (
        '{"url": "http://127.0.0.1:4242", "b": "https://127.0.0.1:4242",'
        ' "c": "http://gone.ns.svc:80/x", "d": "http://example.com"}'
    )
