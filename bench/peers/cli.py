"""The command line ``bench.peers_bench`` starts every peer server with.

Standard library only: each peer imports it from the tree inside its own virtualenv.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NamedTuple


class Ports(NamedTuple):
    """The free ports the bench picked for a peer that listens on HTTP, gRPC and metrics."""

    http: int
    grpc: int
    metrics: int


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    return parser


def parse_port(argv: Sequence[str] | None = None) -> int:
    """Return ``--port``: the HTTP port the bench picked."""
    port: int = _parser().parse_args(argv).port
    return port


def parse_ports(argv: Sequence[str] | None = None) -> Ports:
    """Return ``--port`` (HTTP) and ``--side-ports`` (gRPC, then metrics)."""
    parser = _parser()
    parser.add_argument(
        "--side-ports", type=int, nargs=2, required=True, metavar=("GRPC", "METRICS")
    )
    args = parser.parse_args(argv)
    grpc_port, metrics_port = args.side_ports
    return Ports(args.port, grpc_port, metrics_port)
