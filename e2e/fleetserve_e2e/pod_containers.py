"""Turn a Fleetserve pod into the containers podman runs for it (pure; no I/O).

The container backend of the fake kubelet runs a pod of a Fleetserve image (the runtime's or
the operator's) from that image, as a kubelet does:

- each container's ``image`` (through an optional map to a local tag), ``command`` (replacing
  the ENTRYPOINT) and ``args`` as written: the container has its own network namespace and
  listens on its own container port, so no listen flag is rewritten;
- env: literal values, downward-API fieldRefs, and secretKeyRef/configMapKeyRef values read
  through `Lookup`; a missing non-optional reference stops the pod from starting; under them,
  as a kubelet gives every container, ``KUBERNETES_SERVICE_HOST``/``PORT``: the API server's
  in-cluster name (`pki.APISERVER_NAME`, in its serving certificate) and its port, so an
  in-cluster client (the operator) finds it with the projected token and CA below;
- volumes as host directories under the pod's directory: emptyDir (a ``medium: Memory`` one
  mounted by a single container is a tmpfs of its sizeLimit instead), secret and configMap
  files (``items`` and ``defaultMode`` honoured, mounted read-only), a projected volume's
  service-account token, ConfigMap items and downward-API files; a hostPath directory under
  the pod's node's own directory;
- the securityContext (pod, then container): runAsUser/runAsGroup, readOnlyRootFilesystem,
  ``capabilities.drop: [ALL]``, ``allowPrivilegeEscalation: false``; resources.limits memory
  and cpu;
- every containerPort, and every port the image listens on (the runtime's ``--port`` and
  ``--grpc-port``, the operator's metrics and health ports), published on 127.0.0.1 at a free
  host port, where the readiness probe and the pod map reach it;
- labels naming the pod and the cluster, by which leftovers are removed;
- the cluster's host names (``RunnerConfig.host_names``) and the API server's name resolving
  to the host's loopback in every container, the stand-in for the cluster DNS that names the
  API server and the stores pods fetch from: the API server still listens on 127.0.0.1 only,
  which slirp4netns's ``allow_host_loopback`` forwards to.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path, PurePosixPath

from fleetserve_e2e.images.containers import ContainerSpec, Mount
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pki import APISERVER_NAME
from fleetserve_e2e.pod_launch import (
    HttpProbe,
    distinct_ports,
    field_value,
    image_of,
    listen_ports,
    readiness_probe,
)

POD_UID_LABEL = "io.fleetserve.e2e.pod-uid"
CLUSTER_LABEL = "io.fleetserve.e2e.cluster"
POD_LABEL = "io.fleetserve.e2e.pod"
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
_DEFAULT_FILE_MODE = 0o644
_TOKEN_FILE = "token"

Lookup = Callable[[str, str], JsonObject | None]
"""(``secrets`` or ``configmaps``, name) → the object in the pod's namespace, None if absent."""

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


class PodSpecError(ValueError):
    """The pod cannot start as written (a missing Secret key, a mount of no volume, ...)."""


@dataclass(frozen=True)
class VolumeFile:
    """One file of a secret, configMap or projected volume, relative to the volume's root."""

    path: str
    content: bytes
    mode: int


@dataclass(frozen=True)
class HostVolume:
    """A pod volume kept on the host: ``dir_name`` under the pod's directory, with its files."""

    name: str
    dir_name: str
    files: tuple[VolumeFile, ...] = ()
    read_only: bool = False
    token_file: str | None = None
    """Where in the volume the pod's service-account token goes (a projected token)."""
    node_path: Path | None = None
    """A hostPath volume: the directory on the pod's simulated node, bound as it is (never
    made world-writable: whoever prepares the node decides its owner)."""
    create: bool = False
    """A hostPath of type ``DirectoryOrCreate``: made (0755, root) when the node lacks it."""


@dataclass(frozen=True)
class PlannedContainer:
    """One container of the pod: its name in the pod, its podman name and what to run."""

    name: str
    container_name: str
    spec: ContainerSpec
    termination_file: str
    """File name, in the pod's directory, bound at the container's terminationMessagePath."""
    fallback_to_logs: bool


@dataclass(frozen=True)
class ContainersPlan:
    """How to run one pod as containers: init containers in order, then the main one."""

    init: tuple[PlannedContainer, ...]
    main: PlannedContainer
    volumes: tuple[HostVolume, ...]
    host_ports: Mapping[int, int]
    readiness: HttpProbe | None
    serving_port: int | None
    """The host port of the runtime's inference API, which the pod map publishes; None for
    the operator, which serves no inference."""
    grpc_port: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    fs_group: int | None = None
    """The pod's ``fsGroup``: group owner of its Secret, ConfigMap and projected volumes."""


def parse_quantity(quantity: str) -> Decimal:
    """A Kubernetes quantity (``512Mi``, ``1G``, ``500m``, ``2``) as a number."""
    text = str(quantity)
    if text.endswith("m") and text[:-1].replace(".", "", 1).isdigit():
        return Decimal(text[:-1]) / 1000
    matched = _QUANTITY.match(text)
    if matched is None or matched.group(2) not in _SUFFIXES:
        raise PodSpecError(f"not a quantity: {quantity!r}")
    return Decimal(matched.group(1)) * _SUFFIXES[matched.group(2)]


def _decoded(obj: JsonObject, kind: str) -> dict[str, bytes]:
    """The data of a Secret (base64) or ConfigMap (text and binaryData) as bytes per key."""
    if kind == "secrets":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _key_ref(ref: JsonObject, kind: str, lookup: Lookup) -> str | None:
    obj = lookup(kind, ref["name"])
    value = None if obj is None else _decoded(obj, kind).get(ref["key"])
    if value is None and not ref.get("optional", False):
        raise PodSpecError(f"{kind[:-1]} {ref['name']!r} has no key {ref['key']!r}")
    return None if value is None else value.decode()


def resolved_env(pod: JsonObject, container: JsonObject, lookup: Lookup) -> dict[str, str]:
    """The container's env: literal values, fieldRefs, Secret and ConfigMap keys.

    Raises:
        PodSpecError: A non-optional Secret or ConfigMap key does not exist.
    """
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        value: str | None
        if "value" in var:
            value = str(var["value"])
        elif "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            value = _key_ref(source["secretKeyRef"], "secrets", lookup)
        elif "configMapKeyRef" in source:
            value = _key_ref(source["configMapKeyRef"], "configmaps", lookup)
        else:
            value = None
        if value is not None:
            env[var["name"]] = value
    return env


def _object_files(source: JsonObject, kind: str, name: str, lookup: Lookup) -> list[VolumeFile]:
    """Files of a secret or configMap volume (or projected source): all keys, or ``items``."""
    obj = lookup(kind, name)
    if obj is None:
        if source.get("optional", False):
            return []
        raise PodSpecError(f"{kind[:-1]} {name!r} does not exist")
    data = _decoded(obj, kind)
    mode = int(source.get("defaultMode", _DEFAULT_FILE_MODE))
    items = source.get("items") or [{"key": key, "path": key} for key in sorted(data)]
    files = []
    for item in items:
        if item["key"] not in data:
            raise PodSpecError(f"{kind[:-1]} {name!r} has no key {item['key']!r}")
        files.append(VolumeFile(item["path"], data[item["key"]], int(item.get("mode", mode))))
    return files


def _projected(
    pod: JsonObject, volume: JsonObject, lookup: Lookup
) -> tuple[list[VolumeFile], str | None]:
    """A projected volume's files, and where its service-account token goes."""
    projected = volume["projected"]
    mode = int(projected.get("defaultMode", _DEFAULT_FILE_MODE))
    files: list[VolumeFile] = []
    token: str | None = None
    for source in projected.get("sources", []):
        if "serviceAccountToken" in source:
            token = str(source["serviceAccountToken"].get("path", _TOKEN_FILE))
        for kind, key in (("secrets", "secret"), ("configmaps", "configMap")):
            if key in source:
                inner = {"defaultMode": mode, **source[key]}
                files += _object_files(inner, kind, source[key]["name"], lookup)
        for item in source.get("downwardAPI", {}).get("items", []):
            value = field_value(pod, item["fieldRef"]["fieldPath"]).encode()
            files.append(VolumeFile(item["path"], value, int(item.get("mode", mode))))
    return files, token


def _mounts_by_volume(pod: JsonObject) -> dict[str, int]:
    """How many containers (init or not) mount each volume."""
    counts: dict[str, int] = {}
    for container in _all_containers(pod):
        for name in {m["name"] for m in container.get("volumeMounts", [])}:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _all_containers(pod: JsonObject) -> list[JsonObject]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"].get("containers", [])]


def memory_tmpfs(pod: JsonObject) -> dict[str, str]:
    """Volume name → tmpfs options, for the ``medium: Memory`` emptyDirs of a single container.

    A memory emptyDir that several containers share is a host directory instead: a tmpfs
    belongs to one container.
    """
    shared = _mounts_by_volume(pod)
    found: dict[str, str] = {}
    for volume in pod["spec"].get("volumes", []):
        empty_dir = volume.get("emptyDir")
        if empty_dir is None or empty_dir.get("medium") != "Memory":
            continue
        if shared.get(volume["name"], 0) <= 1:
            size = empty_dir.get("sizeLimit")
            size_option = "" if size is None else f",size={int(parse_quantity(size))}"
            found[volume["name"]] = f"rw,mode=1777{size_option}"
    return found


def fs_group(pod: JsonObject) -> int | None:
    """The pod's ``securityContext.fsGroup``, if it sets one."""
    value = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    return None if value is None else int(value)


def node_directory(work_dir: Path, node: str) -> Path:
    """The root of a simulated node's file system, where its pods' hostPath volumes live."""
    return work_dir / "nodes" / node


def host_volumes(pod: JsonObject, lookup: Lookup, node_dir: Path | None = None) -> list[HostVolume]:
    """The pod's volumes that live in host directories, with the files they hold.

    A hostPath ``/p`` is ``<node_dir>/p``: each simulated node has its own directory tree, so
    what one node's pods leave there, another node's do not see.

    Raises:
        PodSpecError: A secret or configMap (or one of its ``items``) does not exist, or a
            hostPath is of a type other than a directory, or there is no node directory.
    """
    in_memory = memory_tmpfs(pod)
    volumes: list[HostVolume] = []
    for index, volume in enumerate(pod["spec"].get("volumes", [])):
        name = volume["name"]
        dir_name = f"volume-{index}"
        if "emptyDir" in volume and name not in in_memory:
            volumes.append(HostVolume(name, dir_name))
        elif "secret" in volume:
            source = volume["secret"]
            files = _object_files(source, "secrets", source["secretName"], lookup)
            volumes.append(HostVolume(name, dir_name, tuple(files), read_only=True))
        elif "configMap" in volume:
            source = volume["configMap"]
            files = _object_files(source, "configmaps", source["name"], lookup)
            volumes.append(HostVolume(name, dir_name, tuple(files), read_only=True))
        elif "projected" in volume:
            files, token = _projected(pod, volume, lookup)
            volumes.append(HostVolume(name, dir_name, tuple(files), True, token_file=token))
        elif "hostPath" in volume:
            volumes.append(_host_path(name, dir_name, volume["hostPath"], node_dir))
    return volumes


def _host_path(name: str, dir_name: str, source: JsonObject, node_dir: Path | None) -> HostVolume:
    kind = source.get("type") or "Directory"
    if kind not in ("Directory", "DirectoryOrCreate"):
        raise PodSpecError(f"volume {name!r}: hostPath type {kind!r} is not simulated")
    path = PurePosixPath(source["path"])
    if node_dir is None or not path.is_absolute() or ".." in path.parts:
        raise PodSpecError(f"volume {name!r}: hostPath {str(path)!r} has no node directory")
    return HostVolume(
        name,
        dir_name,
        node_path=node_dir / path.relative_to("/"),
        create=kind == "DirectoryOrCreate",
    )


def _mounts(
    container: JsonObject, volumes: Mapping[str, HostVolume], pod_dir: Path
) -> tuple[Mount, ...]:
    mounts = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"])
        if volume is None:
            continue  # a tmpfs volume: see `memory_tmpfs`
        source = volume.node_path or pod_dir / volume.dir_name
        if mount.get("subPath"):
            source = source / mount["subPath"]
        read_only = bool(mount.get("readOnly", False)) or volume.read_only
        mounts.append(Mount(source, mount["mountPath"], read_only))
    return tuple(mounts)


def _user(pod: JsonObject, container: JsonObject) -> str | None:
    """``uid[:gid]`` from the container's securityContext, else the pod's; None: the image's."""
    pod_context = pod["spec"].get("securityContext") or {}
    context = {**pod_context, **(container.get("securityContext") or {})}
    uid, gid = context.get("runAsUser"), context.get("runAsGroup")
    if uid is None:
        return None if gid is None else f"0:{gid}"  # podman needs a user with a group
    return str(uid) if gid is None else f"{uid}:{gid}"


def image_ref(container: JsonObject, images: Mapping[str, str]) -> str:
    """The image to run: the container's reference, or the local tag `images` maps it to."""
    ref = str(container["image"])
    return images.get(ref, ref)


def container_spec(
    pod: JsonObject,
    container: JsonObject,
    *,
    env: Mapping[str, str],
    images: Mapping[str, str],
    volumes: Mapping[str, HostVolume],
    pod_dir: Path,
    termination_file: str,
    ports: Mapping[int, int],
    labels: Mapping[str, str],
    host_names: Sequence[str] = (),
) -> ContainerSpec:
    """The podman container for one of the pod's containers."""
    context = container.get("securityContext") or {}
    drop = {str(c).upper() for c in context.get("capabilities", {}).get("drop", [])}
    limits = container.get("resources", {}).get("limits", {})
    memory = limits.get("memory")
    cpu = limits.get("cpu")
    in_memory = memory_tmpfs(pod)
    tmpfs = {
        m["mountPath"]: in_memory[m["name"]]
        for m in container.get("volumeMounts", [])
        if m["name"] in in_memory
    }
    termination = Mount(
        pod_dir / termination_file,
        str(container.get("terminationMessagePath", DEFAULT_TERMINATION_PATH)),
    )
    command = container.get("command")
    return ContainerSpec(
        image=image_ref(container, images),
        args=tuple(str(arg) for arg in container.get("args", [])),
        entrypoint=json.dumps(command) if command else None,
        user=_user(pod, container),
        read_only=bool(context.get("readOnlyRootFilesystem", False)),
        tmpfs=tmpfs,
        memory=None if memory is None else str(int(parse_quantity(memory))),
        cpus=None if cpu is None else str(parse_quantity(cpu)),
        env=dict(env),
        ports=dict(ports),
        mounts=(*_mounts(container, volumes, pod_dir), termination),
        labels=dict(labels),
        drop_all_capabilities="ALL" in drop,
        no_new_privileges=context.get("allowPrivilegeEscalation") is False,
        groups=tuple(group for group in (fs_group(pod),) if group is not None),
        host_names=tuple(host_names),
    )


def container_name(pod: JsonObject, name: str) -> str:
    """The podman name of one container of the pod: unique by the pod's uid."""
    return f"fleetserve-pod-{pod['metadata']['uid']}-{name}"


def pod_labels(pod: JsonObject, cluster: str) -> dict[str, str]:
    """The labels every container of the pod carries."""
    meta = pod["metadata"]
    return {
        POD_UID_LABEL: meta["uid"],
        POD_LABEL: f"{meta['namespace']}/{meta['name']}",
        CLUSTER_LABEL: cluster,
    }


def service_env(apiserver_port: int) -> dict[str, str]:
    """What a kubelet tells every container about the API server (the ``kubernetes`` Service).

    A kubelet names the Service's cluster IP; no container here can route to one, so the host
    is the API server's in-cluster name, which resolves to the host's loopback inside the
    container, and the port is the one the API server listens on there.
    """
    return {
        "KUBERNETES_SERVICE_HOST": APISERVER_NAME,
        "KUBERNETES_SERVICE_PORT": str(apiserver_port),
    }


def containers_plan(
    pod: JsonObject,
    container: JsonObject,
    *,
    lookup: Lookup,
    images: Mapping[str, str],
    pod_dir: Path,
    allocate_port: Callable[[], int],
    cluster: str,
    apiserver_port: int,
    host_names: Sequence[str] = (),
    node_dir: Path | None = None,
) -> ContainersPlan:
    """How to run the pod's init containers and its Fleetserve `container` with podman.

    `apiserver_port` is the port of the API server on the host's loopback (`service_env`).

    Raises:
        ValueError: `container` runs no Fleetserve image, or its readiness probe names an
            unknown port.
        PodSpecError: A Secret or ConfigMap the pod reads is missing.
    """
    image = image_of(container)
    if image is None:
        raise ValueError(f"container {container['name']!r} runs no Fleetserve image")
    args = [str(arg) for arg in container.get("args", [])]
    main_env = resolved_env(pod, container, lookup)
    listening = listen_ports(image, args, main_env)
    declared = {int(port["containerPort"]) for port in container.get("ports", [])}
    # Port 0 turns an operator endpoint off: nothing listens, nothing to publish.
    host_ports = distinct_ports(sorted((declared | set(listening.values())) - {0}), allocate_port)
    volumes = {volume.name: volume for volume in host_volumes(pod, lookup, node_dir)}
    labels = pod_labels(pod, cluster)
    names = tuple(dict.fromkeys((*host_names, APISERVER_NAME)))

    def planned(
        spec: JsonObject, ports: Mapping[int, int], env: Mapping[str, str]
    ) -> PlannedContainer:
        termination_file = f"termination-{spec['name']}"
        return PlannedContainer(
            name=spec["name"],
            container_name=container_name(pod, spec["name"]),
            spec=container_spec(
                pod,
                spec,
                # The pod spec's own variables win over the kubelet's, as in a cluster.
                env={**service_env(apiserver_port), **env},
                images=images,
                volumes=volumes,
                pod_dir=pod_dir,
                termination_file=termination_file,
                ports=ports,
                labels=labels,
                host_names=names,
            ),
            termination_file=termination_file,
            fallback_to_logs=spec.get("terminationMessagePolicy") == "FallbackToLogsOnError",
        )

    serving, grpc = listening.get("--port"), listening.get("--grpc-port")
    return ContainersPlan(
        init=tuple(
            planned(spec, {}, resolved_env(pod, spec, lookup))
            for spec in pod["spec"].get("initContainers", [])
        ),
        main=planned(container, host_ports, main_env),
        volumes=tuple(volumes.values()),
        host_ports=host_ports,
        readiness=readiness_probe(container, host_ports),
        serving_port=None if serving is None else host_ports[serving],
        grpc_port=None if grpc is None else host_ports[grpc],
        labels=labels,
        fs_group=fs_group(pod),
    )


def volume_file_paths(volume: HostVolume) -> list[PurePosixPath]:
    """The relative paths of a volume's files, refusing any that would leave the volume.

    Raises:
        PodSpecError: A path is absolute or climbs out with ``..``.
    """
    paths = []
    for item in volume.files:
        path = PurePosixPath(item.path)
        if path.is_absolute() or ".." in path.parts:
            raise PodSpecError(f"volume {volume.name!r}: path {item.path!r} leaves the volume")
        paths.append(path)
    return paths
