"""An ASGI app under uvicorn in a thread of the test process, on a free loopback port.

For tests that need real sockets (a client that stops reading, a stalled event loop) but
the runtime's objects at hand; `fleetserve_runtime.testing.process` runs a whole process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

STOP_TIMEOUT_S = 30.0
"""How long the server may take to stop once asked."""


@contextmanager
def uvicorn_thread(app: Callable[..., Any], **config: Any) -> Iterator[int]:
    """`app` under uvicorn (`config` for `uvicorn.Config`) on 127.0.0.1, in a daemon thread.

    Yields the port once uvicorn listens (it may take 30 s to start); on leaving, asks it to
    exit and waits for the thread.
    """
    settings = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, **config)
    server = uvicorn.Server(settings)
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()
    try:
        for _ in range(600):
            if server.started or not thread.is_alive():
                break
            time.sleep(0.05)
        assert server.started, "the server did not start"
        port: int = server.servers[0].sockets[0].getsockname()[1]
        yield port
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
