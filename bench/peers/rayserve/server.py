"""MiniLM on Ray Serve: one replica, ``@serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)``.

As Ray Serve's dynamic request batching guide shows: the deployment's ``__call__`` awaits an
async method decorated with ``@serve.batch``, which receives a list of the queued single
inputs and returns a list of the same length. The script starts a local Ray with one CPU
(the server's core) and no dashboard, binds Serve's HTTP proxy to 127.0.0.1, deploys the app
at ``/embed``, and keeps running until it is stopped.

Usage: ``python -m bench.peers.rayserve.server --port N`` (in the peer's virtualenv)
"""

# The framework lives only in the peer's virtualenv, so mypy sees it untyped.
# mypy: disable-error-code="import-not-found", allow-untyped-decorators, allow-untyped-calls

from __future__ import annotations

import signal

import ray
from ray import serve
from starlette.requests import Request

from bench.peers.cli import parse_port
from bench.peers.encoder import MiniLM


@serve.deployment(num_replicas=1, max_ongoing_requests=64)
class MiniLMDeployment:
    """Text in, unit-norm embedding out."""

    def __init__(self) -> None:
        self.model = MiniLM()

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One forward pass for the texts Serve queued together."""
        embeddings: list[list[float]] = self.model.embed(texts).tolist()
        return embeddings

    async def __call__(self, request: Request) -> dict[str, list[float]]:
        """``{"text": ...}`` to ``{"embedding": [...]}``."""
        body = await request.json()
        return {"embedding": await self.embed(body["text"])}


def main() -> None:
    """Start Ray and Serve on 127.0.0.1, deploy, and wait for SIGTERM."""
    port = parse_port()
    ray.init(num_cpus=1, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # The decorator made the class a Deployment, which mypy cannot see through Any.
    serve.run(MiniLMDeployment.bind(), route_prefix="/embed")  # type: ignore[attr-defined]
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    serve.shutdown()


if __name__ == "__main__":
    main()
