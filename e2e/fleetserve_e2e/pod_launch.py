"""Turn a runtime pod's container into a local command line (pure; no I/O).

The harness has no container runtime, so it runs the container's command on the host:
command names resolve through a table (by default to the repo's virtualenv, which stands in for
the image's PATH), the pod's args and env are kept, and the listen address is rewritten to
``--host 127.0.0.1 --port <free port>`` so many pods can share one machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from fleetserve_e2e.kubeapi import JsonObject

RUNTIME_IMAGE_MARKER = "fleetserve-runtime"
RUNTIME_COMMAND = "fleetserve-runtime"
DEFAULT_READINESS_PATH = "/v2/health/ready"
_LISTEN_FLAGS = ("--host", "--port")


@dataclass(frozen=True)
class LaunchPlan:
    """How to run one pod's runtime container as a local process."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    readiness_path: str


def prestop_sleep_s(pod: JsonObject) -> float:
    """Seconds of the runtime container's native `preStop` sleep action (0 when it has none)."""
    container = runtime_container(pod)
    if container is None:
        return 0.0
    sleep = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
    return float(sleep.get("seconds", 0))


def runtime_container(pod: JsonObject) -> JsonObject | None:
    """Return the pod's Fleetserve runtime container, or None for any other pod."""
    for container in pod["spec"].get("containers", []):
        if RUNTIME_IMAGE_MARKER in container.get("image", ""):
            result: JsonObject = container
            return result
    return None


def without_listen_flags(args: Sequence[str]) -> list[str]:
    """Drop ``--host``/``--port`` in both ``--flag value`` and ``--flag=value`` forms."""
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


def resolve_command(command: Sequence[str], commands: Mapping[str, Sequence[str]]) -> list[str]:
    """Map the container's command to a host command line.

    An empty command means the image's entrypoint, which for the runtime image is
    ``fleetserve-runtime``.  A program whose base name is in ``commands`` is replaced by that
    entry's argv; anything else runs as written.
    """
    program, *rest = command or [RUNTIME_COMMAND]
    mapped = commands.get(PurePath(program).name)
    return [*(mapped if mapped is not None else [program]), *rest]


def _field_value(pod: JsonObject, field_path: str) -> str:
    """Resolve the downward-API fields a runtime pod is likely to use."""
    values = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if field_path.startswith("metadata.labels['"):
        key = field_path.removeprefix("metadata.labels['").removesuffix("']")
        return str(pod["metadata"].get("labels", {}).get(key, ""))
    return str(values.get(field_path, ""))


def container_env(pod: JsonObject, container: JsonObject) -> dict[str, str]:
    """Return the container's env: literal values and downward-API fieldRefs.

    ConfigMap and Secret references are not resolved; such variables are left unset.
    """
    env: dict[str, str] = {}
    for var in container.get("env", []):
        field_ref: dict[str, Any] = var.get("valueFrom", {}).get("fieldRef", {})
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif field_ref:
            env[var["name"]] = _field_value(pod, field_ref["fieldPath"])
    return env


def readiness_path(container: JsonObject) -> str:
    """Return the readiness probe's HTTP path, or the runtime's default one."""
    http_get: dict[str, Any] = container.get("readinessProbe", {}).get("httpGet", {})
    return str(http_get.get("path", DEFAULT_READINESS_PATH))


def launch_plan(
    pod: JsonObject,
    container: JsonObject,
    *,
    commands: Mapping[str, Sequence[str]],
    base_env: Mapping[str, str],
    port: int,
) -> LaunchPlan:
    """Return the local command line, env and port for a runtime pod's container."""
    written = resolve_command(container.get("command", []), commands) + container.get("args", [])
    argv = [*without_listen_flags(written), "--host", "127.0.0.1", "--port", str(port)]
    return LaunchPlan(
        argv=tuple(argv),
        env={**base_env, **container_env(pod, container)},
        port=port,
        readiness_path=readiness_path(container),
    )
