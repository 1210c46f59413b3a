"""Pick free loopback TCP ports and pod addresses, so several clusters and pods run side by side.

`free_port` and `free_ports` are also the runtime's test helpers
(`fleetserve_runtime.testing.process`); the harness keeps its own, since it drives the
product's programs from outside and imports none of its packages.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import random
import socket
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Self


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The kernel picks it from the ephemeral range; the tiny window before the caller binds it
    is acceptable for tests.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> tuple[int, ...]:
    """`count` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    Each is held bound until all are picked: `free_port` called twice may get the same port
    back from the kernel, and a server told to listen twice on one port fails to start.
    """
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return tuple(int(sock.getsockname()[1]) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


@dataclasses.dataclass(frozen=True)
class PortSet:
    """Base of a frozen dataclass whose fields are all ports, one listener each."""

    @classmethod
    def pick(cls) -> Self:
        """One free port per field, all distinct (`free_ports`)."""
        return cls(*free_ports(len(dataclasses.fields(cls))))


def remembered_port(record: Path) -> int:
    """The port written in ``record`` if it is free now, else a free one, written there.

    For a server whose clients cache by address: podman remembers which layers a registry
    already holds by the registry's host and port, so a registry that comes back on the same
    port is sent only the layers it lacks.
    """
    try:
        port = int(record.read_text(encoding="utf-8"))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
    except (OSError, ValueError):
        port = free_port()
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(str(port), encoding="utf-8")
    return port


POD_NETWORK = ipaddress.IPv4Network("127.0.0.0/8")
"""Where pod addresses come from: all of 127.0.0.0/8 is the loopback interface on Linux."""


def free_pod_ip(
    ports: Collection[int],
    *,
    taken: Collection[str] = (),
    choose: Callable[[], int] = lambda: random.randrange(1, POD_NETWORK.num_addresses - 1),
    attempts: int = 64,
) -> str:
    """Return a loopback address, other than 127.0.0.1 and `taken`, where every port is free.

    A pod of its own address listens on its container ports unchanged, as in a pod network, so
    the EndpointSlices the controller-manager writes (pod IP, container port) reach it.  The
    address is drawn at random from 127.0.0.0/8 (`choose` picks the offset) so that clusters
    running side by side rarely meet, and every port is bound once to prove it free there: a
    wildcard listener on the host takes a port on every address.  `taken` holds addresses of
    live pods whose process may be between restarts, and so not listening.

    Raises:
        OSError: No address with all the ports free was found in `attempts` draws.
    """
    for _ in range(attempts):
        address = str(POD_NETWORK[choose()])
        if address == "127.0.0.1" or address in taken:
            continue
        if all(_bindable(address, port) for port in ports):
            return address
    raise OSError(f"no loopback address with ports {sorted(ports)} free in {attempts} draws")


def _bindable(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True
