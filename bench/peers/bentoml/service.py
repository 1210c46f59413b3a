"""MiniLM as a BentoML service with a batchable API.

As BentoML's adaptive batching guide shows: ``@bentoml.api(batchable=True)`` makes the
method take a list; BentoML concatenates the lists of queued requests along ``batch_dim``
0 up to ``max_batch_size`` and splits the result back. BentoML has no fixed wait knob: its
dispatcher sizes the wait from the latencies it observes, under ``max_latency_ms`` (left at
its default). One worker, as ``workers=1`` pins it.
"""

# The framework lives only in the peer's virtualenv, so mypy sees it untyped.
# mypy: disable-error-code="import-not-found", allow-untyped-decorators, allow-untyped-calls

from __future__ import annotations

import bentoml
import numpy as np
import numpy.typing as npt

from bench.peers.encoder import MiniLM


@bentoml.service(workers=1, resources={"cpu": "1"})
class MiniLMService:
    """Texts in, unit-norm embeddings out."""

    def __init__(self) -> None:
        self.model = MiniLM()

    @bentoml.api(batchable=True, max_batch_size=32)
    def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """One forward pass for the merged batch."""
        return self.model.embed(texts)
