"""The real CLI as a process: HTTP over loopback, env configuration, clean shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

CLI = Path(sys.executable).with_name("fleetserve-runtime")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail("server did not become ready")


@pytest.fixture
def server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A runtime process configured through FLEETSERVE_* variables and flags."""
    port = free_port()
    env = {
        **os.environ,
        "FLEETSERVE_MODEL": "builtin://synthetic?latency_ms=20&per_item_ms=0",
        "FLEETSERVE_NAME": "proc",
        "FLEETSERVE_BATCHING_MAX_BATCH_SIZE": "8",
        "FLEETSERVE_TRACK": "canary",
    }
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", str(port), "--device", "cpu", "--no-warmup"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def test_serves_batches_over_loopback(server: tuple[str, subprocess.Popen[bytes]]) -> None:
    """Concurrent HTTP clients get answers, batched, labelled with the configured track."""
    url, _ = server
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi there"]}]}

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            responses = await asyncio.gather(
                *(client.post("/v2/models/proc/infer", json=body) for _ in range(24))
            )
        return [r.status_code for r in responses]

    assert asyncio.run(burst()) == [200] * 24
    metrics = httpx.get(f"{url}/metrics").text
    assert 'track="canary"' in metrics
    size_sum = [
        line for line in metrics.splitlines() if line.startswith("fleetserve_batch_size_sum")
    ]
    count = [
        line for line in metrics.splitlines() if line.startswith("fleetserve_batch_size_count")
    ]
    assert float(size_sum[0].split()[-1]) == 24
    assert float(count[0].split()[-1]) < 24


def test_sigterm_shuts_down_gracefully(server: tuple[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM runs the lifespan shutdown, then the process ends by that signal.

    uvicorn re-raises the captured signal after its graceful shutdown, so the exit status
    says "terminated by SIGTERM", as a kubelet expects.
    """
    _, proc = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) in (0, -signal.SIGTERM)
    assert proc.stderr is not None
    assert b"Application shutdown complete" in proc.stderr.read()
