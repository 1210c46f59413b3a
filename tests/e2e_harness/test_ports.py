"""Ports picked for one server's listeners never repeat."""

from __future__ import annotations

import socket

from fleetserve_e2e.ports import free_ports


def test_ports_picked_together_are_distinct_and_free() -> None:
    """A server given one port twice fails to start (SeaweedFS did: master port = volume gRPC).

    Picked one at a time, the kernel may hand the same free port back; picked together, never.
    """
    ports = free_ports(300)
    assert len(set(ports)) == len(ports)
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
