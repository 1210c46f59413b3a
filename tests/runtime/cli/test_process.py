"""The real command line as a process: batches over loopback, env configuration, shutdown.

Also what only a process shows: a handler whose import is slow does not stall the probes,
and a model that cannot load stops the process with its reason.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fleetserve_runtime.cli import EXIT_LOAD_FAILED
from fleetserve_runtime.testing.process import (
    ADMIN_TOKEN,
    CLI,
    SYNTH,
    bearer,
    free_port,
    free_ports,
    running_server,
)


@pytest.fixture
def server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A runtime process configured through FLEETSERVE_* variables and flags."""
    env = {
        "FLEETSERVE_MODEL": SYNTH,
        "FLEETSERVE_NAME": "proc",
        "FLEETSERVE_BATCHING_MAX_BATCH_SIZE": "8",
        "FLEETSERVE_TRACK": "canary",
    }
    with running_server(env=env) as running:
        yield running.url, running.proc


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


SLOW_IMPORT = """
import time
time.sleep(3)
from fleetserve_runtime.models.synthetic import SyntheticHandler

def create_handler(name, version, max_sequence_length):
    return SyntheticHandler(name, version, max_sequence_length=max_sequence_length)
"""


@pytest.mark.timeout(90)
def test_a_slow_handler_import_does_not_stall_live(tmp_path: Path) -> None:
    """Loading a handler whose import takes 3 s: /v2/health/live keeps answering 200 at once.

    Resolving a URI imports user code; on the event loop it stalled every request, and the
    loop-stall check (1 s here) failed liveness.
    """
    package = tmp_path / "slowpkg"
    package.mkdir()
    (package / "handler.py").write_text(SLOW_IMPORT)
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN_TOKEN)
    port, admin_port = free_ports(2)
    uri = f"file://{package}"
    args = [
        "--model", SYNTH, "--name", "proc", "--health-loop-stall-s", "1",
        "--model-control", "explicit", "--admin-port", str(admin_port),
        "--admin-token-file", str(admin_file), "--allowed-model-uris", uri,
    ]  # fmt: skip
    with running_server(args, port=port) as server, ThreadPoolExecutor(1) as loader:
        loading = loader.submit(
            httpx.post,
            f"http://127.0.0.1:{admin_port}/v2/repository/models/proc/load",
            json={"parameters": {"version": "v2", "uri": uri}},
            headers=bearer(ADMIN_TOKEN),
            timeout=60,
        )
        probes: list[int | str] = []
        while not loading.done():
            try:
                probes.append(httpx.get(server.url + "/v2/health/live", timeout=0.9).status_code)
            except httpx.TimeoutException:
                probes.append("timed out")
            time.sleep(0.1)
        assert loading.result().json() == {"name": "proc", "active_version": "v2"}
    assert set(probes) == {200}, probes
    assert len(probes) > 10, "the load ended before it could be watched"


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("builtin://synthetic?dim=not-a-number", id="bad-parameter"),
        pytest.param("builtin://no-such-model", id="unknown-builtin"),
    ],
)
def test_a_model_that_cannot_load_stops_the_process(model: str) -> None:
    """The first load failing exits with EXIT_LOAD_FAILED and the reason on stderr.

    A replica that stayed up unready would only be noticed by a progress deadline; exiting
    makes the kubelet report a crash loop with the reason, at once.
    """
    done = subprocess.run(
        [str(CLI), "serve", "--port", str(free_port()), "--model", model, "--log-format", "text"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_LOAD_FAILED
    assert "model load failed" in done.stderr.decode()
