"""MiniLM on PyTriton: Triton's dynamic batcher, ``max_batch_size=32``, 10 ms queue delay.

As PyTriton's quick start shows: an inference function decorated with ``@batch`` gets each
input as one array with the batch on axis 0, and is bound to the bundled ``tritonserver``
with ``Triton.bind``; ``ModelConfig(max_batch_size=...)`` with a ``DynamicBatcher`` makes
Triton merge queued requests. The HTTP, gRPC and metrics listeners are set to this host and
the free ports the bench picked (``--port``, ``--side-ports``).

Usage, in the peer's virtualenv: ``python -m bench.peers.pytriton.server --port N --side-ports G M``
"""

# The framework lives only in the peer's virtualenv, so mypy sees it untyped.
# mypy: disable-error-code="import-not-found", allow-untyped-decorators, allow-untyped-calls

from __future__ import annotations

import os
import sysconfig

import numpy as np
import numpy.typing as npt
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from bench.peers.cli import parse_ports
from bench.peers.encoder import MiniLM


def main() -> None:
    """Bind the model and serve until stopped."""
    ports = parse_ports()
    model = MiniLM()
    # Triton's Python backend stub links libpython3.11 dynamically; without this it finds the
    # system's, whose C objects do not match this interpreter's standard library (PyTriton's
    # docs ask for the same with pyenv or conda interpreters).
    libdir = sysconfig.get_config_var("LIBDIR")
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p
    )

    @batch
    def infer(text: npt.NDArray[np.bytes_]) -> dict[str, npt.NDArray[np.float32]]:
        return {"embedding": model.embed([row[0].decode("utf-8") for row in text])}

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=ports.http,
        grpc_address="127.0.0.1",
        grpc_port=ports.grpc,
        metrics_port=ports.metrics,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name="minilm",
            infer_func=infer,
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="embedding", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(
                max_batch_size=32,
                batcher=DynamicBatcher(max_queue_delay_microseconds=10_000),
            ),
        )
        triton.serve()


if __name__ == "__main__":
    main()
