"""How the fake kubelet's container backend turns a Fleetserve pod into podman containers (pure)."""

from __future__ import annotations

import base64
import itertools
import json
import stat
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fleetserve_e2e.container_pod import write_volume
from fleetserve_e2e.images.containers import Mount
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pki import APISERVER_NAME
from fleetserve_e2e.pod_containers import (
    CLUSTER_LABEL,
    POD_UID_LABEL,
    ContainersPlan,
    HostVolume,
    PodSpecError,
    VolumeFile,
    containers_plan,
    parse_quantity,
    resolved_env,
    volume_file_paths,
)
from fleetserve_e2e.pod_launch import HttpProbe
from fleetserve_e2e.testing import RUNTIME_IMAGE

LOCAL = "localhost/fleetserve/fleetserve-runtime:0.1.0"
OPERATOR_IMAGE = "registry.test/fleetserve/fleetserve-operator:0.1.0"
APISERVER_PORT = 46443
POD_DIR = Path("/work/pods/ns_demo")
SECRET = {"data": {"token": base64.b64encode(b"s3cret").decode(), "other": "eA=="}}
CONFIG_MAP = {"data": {"a.yaml": "a: 1\n"}, "binaryData": {"b.bin": "AAE="}}


def _lookup(kind: str, name: str) -> JsonObject | None:
    objects = {("secrets", "creds"): SECRET, ("configmaps", "settings"): CONFIG_MAP}
    return objects.get((kind, name))


def _restricted() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _runtime(**extra: Any) -> JsonObject:
    return {
        "name": "runtime",
        "image": RUNTIME_IMAGE,
        "command": ["fleetserve-runtime", "serve"],
        "args": ["--model", "builtin://minilm-l6", "--port", "9000", "--grpc-port", "9001"],
        "ports": [
            {"name": "http", "containerPort": 9000},
            {"name": "metrics", "containerPort": 9100},
        ],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}},
        **extra,
    }


def _pod(container: JsonObject, **spec: Any) -> JsonObject:
    return {
        "metadata": {"name": "demo", "namespace": "ns", "uid": "u-1", "labels": {}},
        "spec": {"containers": [container], **spec},
        "status": {},
    }


def _plan(
    pod: JsonObject,
    *,
    host_names: tuple[str, ...] = (),
    pod_dir: Path = POD_DIR,
    node_dir: Path | None = None,
) -> ContainersPlan:
    return containers_plan(
        pod,
        pod["spec"]["containers"][0],
        lookup=_lookup,
        images={RUNTIME_IMAGE: LOCAL},
        pod_dir=pod_dir,
        allocate_port=itertools.count(40000).__next__,
        cluster="/tmp/cluster-a",
        apiserver_port=APISERVER_PORT,
        host_names=host_names,
        node_dir=node_dir,
    )


def test_the_mapped_local_image_runs_the_pods_command_and_args_as_written() -> None:
    """No listen flag is rewritten: the container listens on its own port in its own netns."""
    main = _plan(_pod(_runtime())).main.spec
    assert main.image == LOCAL
    assert json.loads(main.entrypoint or "") == ["fleetserve-runtime", "serve"]
    assert main.args == ("--model", "builtin://minilm-l6", "--port", "9000", "--grpc-port", "9001")


def test_an_unmapped_image_and_no_command_keep_the_reference_and_entrypoint() -> None:
    container = {**_runtime(), "image": "registry.test/fleetserve-runtime:9"}
    del container["command"]
    main = _plan(_pod(container)).main.spec
    assert main.image == "registry.test/fleetserve-runtime:9"
    assert main.entrypoint is None


def test_every_port_is_published_and_the_probe_and_pod_map_use_the_host_ports() -> None:
    plan = _plan(_pod(_runtime()))
    assert plan.host_ports == {9000: 40000, 9001: 40001, 9100: 40002}
    assert plan.main.spec.ports == {9000: 40000, 9001: 40001, 9100: 40002}
    assert plan.readiness == HttpProbe(port=40000, path="/v2/health/ready")
    assert (plan.serving_port, plan.grpc_port) == (40000, 40001)


def test_the_default_port_is_published_without_a_port_flag() -> None:
    container = {**_runtime(args=["--model", "builtin://minilm-l6"]), "ports": []}
    container.pop("readinessProbe")
    plan = _plan(_pod(container))
    assert plan.host_ports == {8080: 40000}
    assert plan.serving_port == 40000
    assert plan.readiness is None


def test_env_resolves_literals_field_refs_secret_and_config_map_keys() -> None:
    env = [
        {"name": "A", "value": "1"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "a.yaml"}}},
        {
            "name": "MAYBE",
            "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}},
        },
    ]
    pod = _pod(_runtime(env=env))
    assert resolved_env(pod, pod["spec"]["containers"][0], _lookup) == {
        "A": "1",
        "POD": "demo",
        "TOKEN": "s3cret",
        "CFG": "a: 1\n",
    }


@pytest.mark.parametrize(("name", "key"), [("creds", "nope"), ("absent", "token")])
def test_a_missing_required_secret_key_stops_the_pod(name: str, key: str) -> None:
    env = [{"name": "X", "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}]
    with pytest.raises(PodSpecError, match=key):
        _plan(_pod(_runtime(env=env)))


def test_security_context_and_limits_become_podman_options() -> None:
    container = _runtime(
        securityContext=_restricted(),
        resources={"limits": {"memory": "512Mi", "cpu": "500m"}},
    )
    pod = _pod(container, securityContext={"runAsUser": 65532, "runAsGroup": 65532})
    main = _plan(pod).main.spec
    assert main.user == "65532:65532"
    assert main.read_only
    assert main.drop_all_capabilities
    assert main.no_new_privileges
    assert main.memory == str(512 * 2**20)
    assert main.cpus == "0.5"


def test_the_containers_own_user_overrides_the_pods_and_no_context_confines_nothing() -> None:
    pod = _pod(_runtime(securityContext={"runAsUser": 1000}), securityContext={"runAsUser": 7})
    assert _plan(pod).main.spec.user == "1000"
    bare = _plan(_pod(_runtime())).main.spec
    assert (bare.user, bare.read_only, bare.drop_all_capabilities) == (None, False, False)
    assert not bare.no_new_privileges
    assert (bare.memory, bare.cpus) == (None, None)


def _volumes_pod() -> JsonObject:
    mounts = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "model", "mountPath": "/models", "readOnly": True},
        {"name": "auth", "mountPath": "/var/run/auth"},
        {"name": "settings", "mountPath": "/etc/fleetserve/a.yaml", "subPath": "a.yaml"},
    ]
    volumes = [
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "model", "emptyDir": {"medium": "Memory"}},
        {
            "name": "auth",
            "secret": {
                "secretName": "creds",
                "items": [{"key": "token", "path": "s3/token"}],
                "defaultMode": 0o400,
            },
        },
        {"name": "settings", "configMap": {"name": "settings"}},
    ]
    fetch = {
        "name": "fetch",
        "image": RUNTIME_IMAGE,
        "args": ["fetch"],
        "volumeMounts": [{"name": "model", "mountPath": "/models"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return _pod(_runtime(volumeMounts=mounts), volumes=volumes, initContainers=[fetch])


def test_volumes_are_host_directories_with_their_files() -> None:
    plan = _plan(_volumes_pod())
    assert plan.volumes == (
        HostVolume("tmp", "volume-0"),
        HostVolume("model", "volume-2"),
        HostVolume("auth", "volume-3", (VolumeFile("s3/token", b"s3cret", 0o400),), True),
        HostVolume(
            "settings",
            "volume-4",
            (VolumeFile("a.yaml", b"a: 1\n", 0o644), VolumeFile("b.bin", b"\x00\x01", 0o644)),
            True,
        ),
    )


def test_mounts_bind_the_volume_directories_read_only_where_asked() -> None:
    main = _plan(_volumes_pod()).main.spec
    assert main.mounts == (
        Mount(POD_DIR / "volume-0", "/tmp"),
        Mount(POD_DIR / "volume-2", "/models", read_only=True),
        Mount(POD_DIR / "volume-3", "/var/run/auth", read_only=True),
        Mount(POD_DIR / "volume-4" / "a.yaml", "/etc/fleetserve/a.yaml", read_only=True),
        Mount(POD_DIR / "termination-runtime", "/dev/termination-log"),
    )


def test_a_memory_empty_dir_of_one_container_is_a_tmpfs_of_its_size_limit() -> None:
    """`shm` is the runtime's alone; `model` is shared with the init container: a host dir."""
    assert _plan(_volumes_pod()).main.spec.tmpfs == {"/dev/shm": f"rw,mode=1777,size={2**26}"}


def test_init_containers_run_in_order_with_their_mounts_and_no_ports() -> None:
    plan = _plan(_volumes_pod())
    (fetch,) = plan.init
    assert fetch.name == "fetch"
    assert fetch.container_name == "fleetserve-pod-u-1-fetch"
    assert fetch.fallback_to_logs
    assert not plan.main.fallback_to_logs
    assert fetch.spec.ports == {}
    assert fetch.spec.args == ("fetch",)
    assert fetch.spec.mounts == (
        Mount(POD_DIR / "volume-2", "/models"),
        Mount(POD_DIR / "termination-fetch", "/dev/termination-log"),
    )


def test_the_clusters_host_names_reach_every_container_init_ones_too() -> None:
    """The fetch init container is the one that needs them: it reaches the stores."""
    plan = _plan(_volumes_pod(), host_names=("seaweedfs-s3",))
    for planned in (*plan.init, plan.main):
        assert planned.spec.host_names == ("seaweedfs-s3", APISERVER_NAME)
    assert _plan(_volumes_pod()).main.spec.host_names == (APISERVER_NAME,)


def test_every_container_finds_the_api_server_as_a_kubelet_tells_it() -> None:
    """KUBERNETES_SERVICE_HOST/PORT: the name in the API server's certificate, its port."""
    plan = _plan(_volumes_pod())
    for planned in (*plan.init, plan.main):
        assert planned.spec.env["KUBERNETES_SERVICE_HOST"] == APISERVER_NAME
        assert planned.spec.env["KUBERNETES_SERVICE_PORT"] == str(APISERVER_PORT)
    # The pod's own variables win, as in a cluster.
    own = _runtime(env=[{"name": "KUBERNETES_SERVICE_PORT", "value": "443"}])
    assert _plan(_pod(own)).main.spec.env["KUBERNETES_SERVICE_PORT"] == "443"


def test_every_container_is_labelled_with_the_pod_and_the_cluster() -> None:
    plan = _plan(_volumes_pod())
    for planned in (*plan.init, plan.main):
        assert planned.spec.labels[POD_UID_LABEL] == "u-1"
        assert planned.spec.labels[CLUSTER_LABEL] == "/tmp/cluster-a"


def test_a_projected_volume_holds_the_token_config_map_items_and_downward_api() -> None:
    projected = {
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "settings", "items": [{"key": "a.yaml", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                    ]
                }
            },
        ],
        "defaultMode": 0o420,
    }
    pod = _pod(_runtime(), volumes=[{"name": "kube-api-access", "projected": projected}])
    (volume,) = _plan(pod).volumes
    assert volume.token_file == "token"
    assert volume.read_only
    assert volume.files == (
        VolumeFile("ca.crt", b"a: 1\n", 0o420),
        VolumeFile("namespace", b"ns", 0o420),
    )


def test_a_missing_secret_volume_stops_the_pod_unless_optional() -> None:
    volume = {"name": "auth", "secret": {"secretName": "absent"}}
    with pytest.raises(PodSpecError, match="absent"):
        _plan(_pod(_runtime(), volumes=[volume]))
    optional = {"name": "auth", "secret": {"secretName": "absent", "optional": True}}
    assert _plan(_pod(_runtime(), volumes=[optional])).volumes == (
        HostVolume("auth", "volume-0", (), True),
    )


def _operator(metrics_port: str = "8081") -> JsonObject:
    """The chart's operator container, as far as the backend reads it."""
    return {
        "name": "operator",
        "image": OPERATOR_IMAGE,
        "args": ["run"],
        "env": [
            {"name": "FLEETSERVE_METRICS_PORT", "value": metrics_port},
            {"name": "FLEETSERVE_LIVENESS_PORT", "value": "8080"},
        ],
        "ports": [{"name": "health", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "health"}},
        "securityContext": _restricted(),
    }


def test_an_operator_pod_runs_its_image_with_its_ports_published_and_no_serving_port() -> None:
    """The image's entrypoint and the pod's args; metrics and health ports on the host."""
    plan = _plan(_pod(_operator(), securityContext={"runAsUser": 65532, "runAsGroup": 65532}))
    main = plan.main.spec
    assert (main.image, main.entrypoint, main.args) == (OPERATOR_IMAGE, None, ("run",))
    assert (main.user, main.read_only, main.drop_all_capabilities) == ("65532:65532", True, True)
    assert plan.host_ports == {8080: 40000, 8081: 40001}
    assert main.ports == plan.host_ports
    assert plan.readiness == HttpProbe(port=40000, path="/healthz")
    assert (plan.serving_port, plan.grpc_port) == (None, None)
    assert main.env["KUBERNETES_SERVICE_HOST"] == APISERVER_NAME


def test_an_operator_endpoint_turned_off_is_not_published() -> None:
    assert _plan(_pod(_operator(metrics_port="0"))).host_ports == {8080: 40000}


def test_a_pod_of_no_fleetserve_image_is_not_planned_as_containers() -> None:
    container = {**_runtime(), "image": "registry.test/busybox:1"}
    with pytest.raises(ValueError, match="no Fleetserve image"):
        _plan(_pod(container))


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b"])
def test_volume_files_may_not_leave_their_volume(path: str) -> None:
    volume = HostVolume("v", "volume-0", (VolumeFile(path, b"", 0o644),))
    with pytest.raises(PodSpecError, match="leaves the volume"):
        volume_file_paths(volume)


@pytest.mark.parametrize(
    ("quantity", "value"),
    [
        ("512Mi", 512 * 2**20),
        ("1G", 10**9),
        ("500m", Decimal("0.5")),
        ("2", 2),
        ("1.5Gi", 3 * 2**29),
    ],
)
def test_quantities(quantity: str, value: Decimal) -> None:
    assert parse_quantity(quantity) == value


def test_a_malformed_quantity_is_refused() -> None:
    with pytest.raises(PodSpecError, match="not a quantity"):
        parse_quantity("lots")


def _host_path_pod(kind: str | None, path: str = "/var/cache/fleetserve/models") -> JsonObject:
    source = {"path": path} | ({"type": kind} if kind else {})
    return _pod(
        {"name": "runtime", "image": RUNTIME_IMAGE,
         "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
        volumes=[{"name": "cache", "hostPath": source}],
    )  # fmt: skip


def test_a_host_path_is_the_nodes_own_directory() -> None:
    """`/var/cache/...` on node n1 is `<node dir>/var/cache/...`, bound read-write."""
    node = Path("/work/nodes/n1")
    plan = _plan(_host_path_pod("DirectoryOrCreate"), node_dir=node)
    (volume,) = plan.volumes
    assert volume.node_path == node / "var/cache/fleetserve/models"
    assert volume.create
    assert plan.main.spec.mounts[0] == Mount(node / "var/cache/fleetserve/models", "/cache")
    assert not _plan(_host_path_pod(None), node_dir=node).volumes[0].create


@pytest.mark.parametrize(
    ("kind", "path", "node"),
    [
        ("File", "/etc/hosts", Path("/n")),
        ("DirectoryOrCreate", "/var/../etc", Path("/n")),
        ("DirectoryOrCreate", "/var/cache", None),
    ],
    ids=["not-a-directory", "climbs-out", "no-node"],
)
def test_a_host_path_the_backend_cannot_honour_stops_the_pod(
    kind: str, path: str, node: Path | None
) -> None:
    with pytest.raises(PodSpecError, match="hostPath"):
        _plan(_host_path_pod(kind, path), node_dir=node)


def test_the_pods_fs_group_owns_its_secret_files_and_joins_every_container(tmp_path: Path) -> None:
    """As a kubelet applies fsGroup: a 0400 Secret file becomes 0440, group fsGroup.

    The containers run with that supplementary group, so a non-root user reads the file.
    """
    pod = _volumes_pod()
    pod["spec"]["securityContext"] = {"runAsUser": 65532, "fsGroup": 65532}
    plan = _plan(pod, pod_dir=tmp_path)
    assert plan.fs_group == 65532
    for planned in (*plan.init, plan.main):
        assert planned.spec.groups == (65532,)
    (secret,) = [v for v in plan.volumes if v.name == "auth"]
    write_volume(tmp_path, secret, None, plan.fs_group)
    written = (tmp_path / secret.dir_name / "s3/token").stat()
    assert (written.st_uid, written.st_gid) == (0, 65532)
    assert stat.S_IMODE(written.st_mode) == 0o440
    without = _plan(_volumes_pod())
    assert without.fs_group is None
    assert without.main.spec.groups == ()
