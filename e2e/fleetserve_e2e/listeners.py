"""Which TCP addresses a process listens on, read from /proc: proof a server is loopback-only."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> tuple[str, int]:
    """Decode a /proc/net/tcp address: ``0100007F:1F90`` (IPv4) or its 32-digit IPv6 form.

    Each 32-bit word of the host is stored in host (little-endian) order.
    """
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    host = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(host)), int(port_hex, 16)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The (host, port) pairs of the TCP sockets in LISTEN state that process ``pid`` holds."""
    inodes = _socket_inodes(pid)
    found = set()
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text(encoding="ascii").splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and inode in inodes:
                found.add(_address(local))
    return found
