"""Pick free loopback TCP ports, so several clusters and pods can run side by side."""

from __future__ import annotations

import socket
from pathlib import Path


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The kernel picks it from the ephemeral range; the tiny window before the caller binds it
    is acceptable for tests.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
