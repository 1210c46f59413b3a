"""Ports picked for one server's listeners never repeat."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from fleetserve_e2e.ports import PortSet, free_ports


def test_ports_picked_together_are_distinct_and_free() -> None:
    """A server given one port twice fails to start (SeaweedFS did: master port = volume gRPC).

    Picked one at a time, the kernel may hand the same free port back; picked together, never.
    """
    ports = free_ports(300)
    assert len(set(ports)) == len(ports)
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_set_picks_one_distinct_port_per_field() -> None:
    """`PortSet.pick` counts the fields itself: a listener added is a port picked."""

    @dataclass(frozen=True)
    class Three(PortSet):
        first: int
        second: int
        third: int

    ports = Three.pick()
    assert len({ports.first, ports.second, ports.third}) == 3
