"""Start ``mlserver start`` on this folder, with its ports and host from the environment.

MLServer reads every server setting from ``MLSERVER_*`` variables as well as from
``settings.json``; the bench picks free ports (``--port`` for HTTP, ``--side-ports`` for gRPC
and metrics), so they are set here. The model comes from
``model-settings.json`` beside this file. Everything else stays at MLServer's defaults,
except the inference worker pool (see ``main``).

Usage, in the peer's virtualenv: ``python -m bench.peers.mlserver.server --port N --side-ports G M``
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.peers.cli import parse_ports


def main() -> None:
    """Replace this process with ``mlserver start`` configured for 127.0.0.1:``--port``."""
    ports = parse_ports()
    env = {
        **os.environ,
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_HTTP_PORT": str(ports.http),
        "MLSERVER_GRPC_PORT": str(ports.grpc),
        "MLSERVER_METRICS_PORT": str(ports.metrics),
        # MLServer 1.7.1's inference pool workers die at start under the pinned uvloop
        # ("There is no current event loop"), so inference runs in the server process, as
        # MLServer's docs describe for parallel_workers 0.
        "MLSERVER_PARALLEL_WORKERS": "0",
    }
    mlserver = str(Path(sys.executable).with_name("mlserver"))
    os.execve(mlserver, [mlserver, "start", str(Path(__file__).parent)], env)


if __name__ == "__main__":
    main()
