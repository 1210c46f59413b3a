"""The real `fleetserve-runtime serve` as a process on loopback, for the encoder model tests.

The ONNX and backend tests go through the whole command line: the flags, the backend choice,
the graph caches a process finds in its `TMPDIR`, and the exit status of a load that fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt

from bench.server_proc import running_server, runtime_serve_argv
from fleetserve_runtime.cli import EXIT_LOAD_FAILED
from fleetserve_runtime.testing import infer_request
from fleetserve_runtime.testing.process import free_port

CLI = Path(sys.executable).with_name("fleetserve-runtime")


@contextmanager
def serving(
    model: str, name: str, log: Path, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """`fleetserve-runtime serve` of `model` as `name` until the block ends; yields its URL.

    `args` are further flags; the process logs text to `log`, with `env` over the environment.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = runtime_serve_argv([str(CLI)], model=model, name=name, port=port)
    with running_server(
        [*argv, "--log-format", "text", *args], base_url=url, core=0, log_path=log, env=env
    ):
        yield url


def embeddings(url: str, name: str, texts: Sequence[str]) -> npt.NDArray[np.float32]:
    """The embeddings the server at `url` returns for `texts`, asked to truncate them."""
    body = infer_request(texts, truncate=True)
    response = httpx.post(f"{url}/v2/models/{name}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def load_failure(*args: str, env: Mapping[str, str] | None = None) -> str:
    """The stderr of `fleetserve-runtime serve` with `args`, which must stop at loading."""
    done = subprocess.run(
        [str(CLI), "serve", "--port", str(free_port()), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_LOAD_FAILED
    return done.stderr.decode()
