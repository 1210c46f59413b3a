"""The custom MLServer runtime: decodes the BYTES input, embeds, encodes an FP32 output.

As MLServer's custom inference runtime guide shows: subclass ``MLModel``, load in ``load``,
answer Open Inference Protocol requests in ``predict`` with MLServer's codecs. Adaptive
batching (``max_batch_size``/``max_batch_time`` in ``model-settings.json``) merges queued
requests along the first axis before ``predict`` and splits the response after it.
"""

# The framework lives only in the peer's virtualenv, so mypy sees it untyped.
# mypy: disable-error-code="import-not-found", allow-subclassing-any, allow-untyped-calls

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse

from bench.peers.encoder import MiniLM


class MiniLMRuntime(MLModel):
    """Text in, unit-norm embedding out."""

    async def load(self) -> bool:
        """Load the model once per worker."""
        self.model = MiniLM()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        """Embed every text of the (possibly merged) request."""
        texts = StringCodec.decode_input(payload.inputs[0])
        embeddings = self.model.embed(list(texts))
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output("embedding", embeddings)],
        )
