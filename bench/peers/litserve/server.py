"""MiniLM on LitServe, batched by LitServe: ``max_batch_size=32``, ``batch_timeout=0.01``.

As LitServe's batching guide shows: the batching knobs are set on the ``LitAPI``; LitServe
collects decoded requests for up to ``batch_timeout`` seconds or ``max_batch_size`` requests,
hands ``predict`` the list (``batch`` keeps strings a plain list), and ``unbatch`` splits
the result back per request. One worker on the CPU, as ``LitServer``'s defaults give.

Usage: ``python -m bench.peers.litserve.server --port N`` (in the peer's virtualenv)
"""

# The framework lives only in the peer's virtualenv, so mypy sees it untyped.
# mypy: disable-error-code="import-not-found", allow-subclassing-any, allow-untyped-calls

# No `from __future__ import annotations`: LitServe reads decode_request's annotation at
# run time to build the request body's schema, and a string annotation fails every request.
from typing import Any

import litserve as ls
import numpy as np
import numpy.typing as npt

from bench.peers.cli import parse_port
from bench.peers.encoder import MiniLM


class MiniLMAPI(ls.LitAPI):
    """Text in, unit-norm embedding out."""

    def setup(self, device: str) -> None:
        """Load the model once per worker."""
        self.model = MiniLM()

    def decode_request(self, request: dict[str, Any]) -> str:
        """The request's text."""
        text: str = request["text"]
        return text

    def batch(self, inputs: list[str]) -> list[str]:
        """Keep the batch a list of strings: the tokenizer pads it."""
        return inputs

    def predict(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """One forward pass for the whole batch."""
        return self.model.embed(texts)

    def unbatch(self, output: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
        """One row per request."""
        return list(output)

    def encode_response(self, output: npt.NDArray[np.float32]) -> dict[str, list[float]]:
        """The row as JSON."""
        return {"embedding": output.tolist()}


def main() -> None:
    """Serve on 127.0.0.1 with one CPU worker."""
    port = parse_port()
    api = MiniLMAPI(max_batch_size=32, batch_timeout=0.01)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1)
    server.run(host="127.0.0.1", port=port, generate_client_file=False)


if __name__ == "__main__":
    main()
