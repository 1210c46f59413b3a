"""The runtime's command line with a gRPC listener, run as its own process for the gRPC tests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.server_proc import running_server, runtime_serve_argv
from fleetserve_runtime.testing.process import CLI, free_ports


@contextmanager
def grpc_runtime(tmp: Path, model: str, flags: Sequence[str]) -> Iterator[tuple[str, str]]:
    """`model` served as "test" without warm-up, with a gRPC listener and `flags`.

    Both listeners take free loopback ports; the log goes to `tmp / "log"`. Yields the HTTP
    base URL and the gRPC address once the server is ready.
    """
    port, grpc_port = free_ports(2)
    argv = runtime_serve_argv([str(CLI)], model=model, name="test", port=port)
    base_url = f"http://127.0.0.1:{port}"
    with running_server(
        [*argv, "--no-warmup", f"--grpc-port={grpc_port}", *flags],
        base_url=base_url,
        core=0,
        log_path=tmp / "log",
    ):
        yield base_url, f"127.0.0.1:{grpc_port}"
