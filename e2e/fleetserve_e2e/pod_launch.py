"""Turn a Fleetserve pod's container into a local command line (pure; no I/O).

The harness has no container runtime and no pod network, so the fake kubelet runs a container
of one of Fleetserve's images (:class:`Image`: the runtime or the operator) on the host:

- Command names resolve through a table (by default to the repo's virtualenv, which stands in
  for the image's PATH); an empty command means the image's entrypoint.
- The pod's args and env (literal values and downward-API fieldRefs) are kept, on top of the
  caller's environment stripped of cluster credentials, proxies and ``FLEETSERVE_*`` settings
  (``identity.isolated_env``).  A pod that mounts a service-account token gets ``KUBECONFIG``
  pointing at a kubeconfig that holds only that token, which the caller writes.
- Ports: the stand-in for a pod's own network namespace.  Every port the container declares or
  listens on maps to a free loopback port, and the process is told to listen on 127.0.0.1 at
  the mapped port, the way its image takes a listen address: the runtime's ``--host``/``--port``
  (and ``--grpc-port``, when the pod turns gRPC on) flags are replaced; the operator gets
  ``FLEETSERVE_LISTEN_ADDRESS=127.0.0.1`` and its
  ``FLEETSERVE_METRICS_PORT``/``FLEETSERVE_LIVENESS_PORT`` set to the mapped ports of the
  container ports they name.  The readiness probe's port, by name or number, resolves through
  the same map.
- A pod network, when the cluster asks for one: the pod gets a loopback address of its own
  (127.x.y.z, `ports.free_pod_ip`) as its podIP and listens there on its container ports
  unchanged, so a Service's EndpointSlices (podIP:targetPort) reach it as they would in a
  cluster; the downward API's ``status.podIP`` says that address.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Any

from fleetserve_e2e.identity import isolated_env
from fleetserve_e2e.kubeapi import JsonObject

LOOPBACK = "127.0.0.1"
_LISTEN_FLAGS = ("--host", "--port", "--grpc-port")
# Where each image listens unless told otherwise: the runtime's RuntimeConfig.port, and the
# operator's OperatorConfig.metrics_port / liveness_port (0 turns an endpoint off).
RUNTIME_DEFAULT_PORT = 8080
OPERATOR_PORT_ENV = {"FLEETSERVE_METRICS_PORT": 8081, "FLEETSERVE_LIVENESS_PORT": 8080}
OPERATOR_LISTEN_ENV = "FLEETSERVE_LISTEN_ADDRESS"


class Image(StrEnum):
    """A Fleetserve image the harness runs: the value is in the image name and is its entrypoint.

    See Dockerfile.runtime and Dockerfile.operator (``ENTRYPOINT``).
    """

    RUNTIME = "fleetserve-runtime"
    OPERATOR = "fleetserve-operator"


@dataclass(frozen=True)
class HttpProbe:
    """An HTTP GET probe aimed at the host: ``http://127.0.0.1:<port><path>``."""

    port: int
    path: str


@dataclass(frozen=True)
class LaunchPlan:
    """How to run one pod's Fleetserve container as a local process."""

    image: Image
    argv: tuple[str, ...]
    env: Mapping[str, str]
    host_ports: Mapping[int, int]
    """Container port → the loopback port the process listens on instead."""
    readiness: HttpProbe | None
    """Where readiness is probed; None (no httpGet readiness probe): ready while running."""
    serving_port: int | None
    """The runtime's inference port on the host, which the pod map publishes; None for the
    operator, which serves no inference."""
    grpc_port: int | None = None
    """The runtime's gRPC port on the host; None unless the pod passes ``--grpc-port``."""
    host: str = LOOPBACK
    """The address the process listens on: 127.0.0.1, or the pod's own (a pod network)."""


def prestop_sleep_s(pod: JsonObject) -> float:
    """Seconds of the Fleetserve container's native `preStop` sleep action (0 when it has none)."""
    container = fleetserve_container(pod)
    if container is None:
        return 0.0
    sleep = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
    return float(sleep.get("seconds", 0))


def image_of(container: JsonObject) -> Image | None:
    """Return the Fleetserve image the container runs, or None for any other image."""
    for image in Image:
        if image.value in container.get("image", ""):
            return image
    return None


def fleetserve_container(pod: JsonObject) -> JsonObject | None:
    """Return the pod's first container of a Fleetserve image, or None for any other pod."""
    for container in pod["spec"].get("containers", []):
        if image_of(container) is not None:
            result: JsonObject = container
            return result
    return None


def without_listen_flags(args: Sequence[str]) -> list[str]:
    """Drop ``--host``/``--port``/``--grpc-port`` as ``--flag value`` and ``--flag=value``."""
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
        elif arg in _LISTEN_FLAGS:
            skip_value = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in _LISTEN_FLAGS)):
            kept.append(arg)
    return kept


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag value`` or ``flag=value`` in `args`, as argparse reads it."""
    found: str | None = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith(f"{flag}="):
            found = arg.removeprefix(f"{flag}=")
    return found


def resolve_command(
    command: Sequence[str], commands: Mapping[str, Sequence[str]], *, entrypoint: str
) -> list[str]:
    """Map the container's command to a host command line.

    An empty command means the image's `entrypoint`.  A program whose base name is in
    ``commands`` is replaced by that entry's argv; anything else runs as written.
    """
    program, *rest = command or [entrypoint]
    mapped = commands.get(PurePath(program).name)
    return [*(mapped if mapped is not None else [program]), *rest]


def field_value(pod: JsonObject, field_path: str, *, pod_ip: str = LOOPBACK) -> str:
    """Resolve the downward-API fields a Fleetserve pod is likely to use; `pod_ip` is its IP."""
    values = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.hostIP": LOOPBACK,
    }
    if field_path.startswith("metadata.labels['"):
        key = field_path.removeprefix("metadata.labels['").removesuffix("']")
        return str(pod["metadata"].get("labels", {}).get(key, ""))
    return str(values.get(field_path, ""))


def container_env(
    pod: JsonObject, container: JsonObject, *, pod_ip: str = LOOPBACK
) -> dict[str, str]:
    """Return the container's env: literal values and downward-API fieldRefs (`pod_ip`: its IP).

    ConfigMap and Secret references are not resolved; such variables are left unset.
    """
    env: dict[str, str] = {}
    for var in container.get("env", []):
        field_ref: dict[str, Any] = var.get("valueFrom", {}).get("fieldRef", {})
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif field_ref:
            env[var["name"]] = field_value(pod, field_ref["fieldPath"], pod_ip=pod_ip)
    return env


def listen_ports(image: Image, args: Sequence[str], env: Mapping[str, str]) -> dict[str, int]:
    """The container ports the process would bind, keyed by the flag or variable that sets each."""
    if image is Image.RUNTIME:
        ports = {"--port": int(flag_value(args, "--port") or RUNTIME_DEFAULT_PORT)}
        grpc = flag_value(args, "--grpc-port")
        return ports if grpc is None else {**ports, "--grpc-port": int(grpc)}
    return {name: int(env.get(name, default)) for name, default in OPERATOR_PORT_ENV.items()}


def readiness_probe(container: JsonObject, host_ports: Mapping[int, int]) -> HttpProbe | None:
    """Return the container's httpGet readiness probe aimed at the host, or None without one.

    Raises:
        ValueError: The probe names a port that the container neither declares nor listens on.
    """
    http_get: dict[str, Any] | None = container.get("readinessProbe", {}).get("httpGet")
    if http_get is None:
        return None
    port = str(http_get["port"])
    # A probe's port is a number or the name of one of the container's ports (IntOrString).
    named = {str(p.get("name")): p["containerPort"] for p in container.get("ports", [])}
    number = int(port) if port.isdigit() else named.get(port)
    if number is None or number not in host_ports:
        raise ValueError(f"readiness probe port {port!r} is not a port of {container['name']!r}")
    return HttpProbe(port=host_ports[number], path=str(http_get.get("path", "/")))


def distinct_ports(ports: Sequence[int], allocate_port: Callable[[], int]) -> dict[int, int]:
    """A different host port for each of `ports`: two free-port probes may return the same."""
    mapped: dict[int, int] = {}
    for port in ports:
        host = allocate_port()
        while host in mapped.values():
            host = allocate_port()
        mapped[port] = host
    return mapped


def launch_plan(
    pod: JsonObject,
    container: JsonObject,
    *,
    commands: Mapping[str, Sequence[str]],
    base_env: Mapping[str, str],
    allocate_port: Callable[[], int],
    kubeconfig: Path | None = None,
    allocate_pod_ip: Callable[[Collection[int]], str] | None = None,
) -> LaunchPlan:
    """Return the local command line, env and ports for a pod's Fleetserve container.

    `allocate_port` returns a free loopback port per call; `kubeconfig` is the pod's token
    kubeconfig, None when the pod mounts no service-account token.  With `allocate_pod_ip`
    (a pod network) the pod listens on its container ports at the address it returns for
    them, and `allocate_port` is not called.

    Raises:
        ValueError: The container runs no Fleetserve image, or its readiness probe names an
            unknown port.
    """
    image = image_of(container)
    if image is None:
        raise ValueError(f"container {container['name']!r} runs no Fleetserve image")
    command = resolve_command(container.get("command", []), commands, entrypoint=image.value)
    args = [*command, *container.get("args", [])]
    inherited = isolated_env(base_env)
    # The ports follow from the args and literal env alone: fieldRefs name no port.
    listening = listen_ports(image, args, {**inherited, **container_env(pod, container)})
    declared = {port["containerPort"] for port in container.get("ports", [])}
    # Port 0 asks for no endpoint (the operator) or any port: nothing to map.
    ports = sorted({*declared, *listening.values()} - {0})
    if allocate_pod_ip is None:
        host = LOOPBACK
        host_ports = distinct_ports(ports, allocate_port)
    else:
        host = allocate_pod_ip(ports)
        host_ports = {port: port for port in ports}
    env = {**inherited, **container_env(pod, container, pod_ip=host)}
    moved = {key: host_ports.get(port, 0) for key, port in listening.items()}
    if image is Image.RUNTIME:
        args = [*without_listen_flags(args), "--host", host, "--port", str(moved["--port"])]
        if "--grpc-port" in moved:
            args += ["--grpc-port", str(moved["--grpc-port"])]
    else:
        env.update({name: str(port) for name, port in moved.items()})
        env[OPERATOR_LISTEN_ENV] = host
    # Without a token the process gets no credentials at all: an unset KUBECONFIG would let
    # a client fall back to ~/.kube/config, the developer's own.
    env["KUBECONFIG"] = str(kubeconfig) if kubeconfig is not None else os.devnull
    return LaunchPlan(
        image=image,
        argv=tuple(args),
        env=env,
        host_ports=host_ports,
        readiness=readiness_probe(container, host_ports),
        serving_port=moved["--port"] if image is Image.RUNTIME else None,
        grpc_port=moved.get("--grpc-port"),
        host=host,
    )
