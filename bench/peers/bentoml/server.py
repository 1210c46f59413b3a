"""Start ``bentoml serve`` for ``bench.peers.bentoml.service:MiniLMService`` on 127.0.0.1.

Usage: ``python -m bench.peers.bentoml.server --port N`` (in the peer's virtualenv)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.peers.cli import parse_port

REPO_ROOT = Path(__file__).resolve().parents[3]


def main() -> None:
    """Replace this process with ``bentoml serve``, the way BentoML's docs start a service."""
    port = parse_port()
    bentoml = str(Path(sys.executable).with_name("bentoml"))
    argv = [
        bentoml,
        "serve",
        "bench.peers.bentoml.service:MiniLMService",
        f"--working-dir={REPO_ROOT}",
        "--host=127.0.0.1",
        f"--port={port}",
    ]
    os.execv(bentoml, argv)


if __name__ == "__main__":
    main()
