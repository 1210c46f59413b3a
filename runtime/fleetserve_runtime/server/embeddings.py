"""OpenAI's embeddings API over the served encoder: `POST /v1/embeddings`.

What the official `openai` client's `embeddings.create` sends to an embedding model
(MiniLM, a sentence-transformers directory, an ONNX encoder). The texts take the path of
`POST /v2/models/{name}/infer`, so the two answer the same texts with the same vectors under
the same rules: `Routes.body` reads the body within its media type, size and time limits,
`check_instances` bounds the number of texts by `max_instances` (413, as on the OIP route),
and `ServingFacade.infer` admits, prioritises (the `X-Fleetserve-*` headers, the priority
token), batches, caches and times them out like any infer request; the bearer token and
request ids are the middleware's, and every answer counts in `fleetserve_requests_total`.
Errors take OpenAI's shape (`generation.openai_failure`, the path is in
`generation.OPENAI_PATHS`); a text over `max_sequence_length` is OpenAI's 400
`context_length_exceeded` naming `input`.

The body: `model` (the served name, else 404; a generative model is a 400 naming `model`),
`input` (a string or a list of strings; token ids are refused with 400 naming `input`:
the encoders take text), `encoding_format` (`float`, or `base64`: each vector's
little-endian float32 bytes, as OpenAI sends them), `dimensions` (only the model's own:
vectors are never shortened, so any other value is a 400 naming it), `user` (accepted,
unused: an end-user id for abuse monitoring). Any other key is a 400 naming it
(`openai_requests.refuse_unknown`), as on the other OpenAI routes.

`usage.prompt_tokens` is the model's own tokenizer's count over all texts (special tokens
included). The engine does not hand back the lengths it measured at its door, so once the
vectors are back the handler that computed them tokenises the texts again: a second
tokenization, never a second forward, and only for requests that succeeded.
"""

from __future__ import annotations

import base64
import time
from typing import Literal, TypedDict

import numpy as np
import numpy.typing as npt
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.core.json_limits import check_depth
from fleetserve_runtime.encoder.engine import InferenceCall
from fleetserve_runtime.models.base import ModelMetadata
from fleetserve_runtime.server.generation_formats import openai_failure
from fleetserve_runtime.server.generation_schemas import TokenId
from fleetserve_runtime.server.http_errors import json_response
from fleetserve_runtime.server.inference_routes import Routes
from fleetserve_runtime.server.openai_requests import refuse_unknown, unknown_keys
from fleetserve_runtime.server.schemas import check_instances, parse_json, validate_body

__all__ = ["EmbeddingList", "EmbeddingRequest", "register_embeddings"]

EncodingFormat = Literal["float", "base64"]


class EmbeddingRequest(BaseModel):
    """`POST /v1/embeddings` body; keys no field reads are kept for `refuse_unknown`."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    """Token ids parse, to be refused by name (`_texts`) rather than as a type mismatch."""
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    user: str | None = None
    """Accepted, unused: an end-user id for abuse monitoring, which changes no vector."""


class Embedding(TypedDict):
    """One text's vector: floats, or their little-endian float32 bytes in base64."""

    object: Literal["embedding"]
    index: int
    embedding: npt.NDArray[np.float32] | str


class EmbeddingUsage(TypedDict):
    """Tokens of the texts, as the model's tokenizer counts them; embeddings generate none."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingList(TypedDict):
    """The answer: one `Embedding` per text, in the request's order."""

    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def _texts(body: EmbeddingRequest) -> list[str]:
    """`input` as a list of texts; `InvalidInput` naming `input` when empty or token ids."""
    given = [body.input] if isinstance(body.input, str) else body.input
    if not given:
        msg = "input must not be empty"
        raise InvalidInput(msg, param="input")
    texts = [item for item in given if isinstance(item, str)]
    if len(texts) != len(given):
        msg = "token-id input is not supported: send a string or a list of strings"
        raise InvalidInput(msg, param="input")
    return texts


def _dimension(metadata: ModelMetadata, name: str) -> int:
    """The length of the model's vectors; `InvalidInput` naming `model` unless it embeds text.

    An embedding model takes strings (`BYTES`) and answers one `FP32` row of fixed width per
    instance (`[-1, dim]`); a model of other tensors has no embeddings to offer.
    """
    shape = metadata.outputs[0].shape
    if (
        metadata.inputs[0].datatype != "BYTES"
        or metadata.outputs[0].datatype != "FP32"
        or len(shape) != 2
        or shape[1] < 1
    ):
        msg = f"model {name!r} does not embed text; use /v2/models/{name}/infer"
        raise InvalidInput(msg, param="model")
    return shape[1]


def _vector(item: object, encoding: EncodingFormat) -> npt.NDArray[np.float32] | str:
    """One result as OpenAI sends it; floats stay an array, which `json_response` writes."""
    row: npt.NDArray[np.float32] = np.ascontiguousarray(item, dtype="<f4")
    if encoding == "base64":
        return base64.b64encode(row.tobytes()).decode("ascii")
    return row


async def _embed(routes: Routes, request: Request) -> Response:
    data = parse_json(await routes.body(request))
    check_depth(data)
    body = validate_body(data, EmbeddingRequest)
    routes.check_name(body.model)
    refuse_unknown([(key, key) for key in unknown_keys(body)])
    texts = _texts(body)
    check_instances(texts, routes.limits)
    runtime = routes.rt
    if runtime.is_generative:
        msg = (
            f"model {body.model!r} generates text and has no embeddings; "
            "use /v1/chat/completions or /v1/completions"
        )
        raise InvalidInput(msg, param="model")
    dimension = _dimension(runtime.model(None).metadata, body.model)
    if body.dimensions is not None and body.dimensions != dimension:
        msg = (
            f"dimensions={body.dimensions} is not supported: this model's embeddings have "
            f"{dimension} dimensions and are not shortened"
        )
        raise InvalidInput(msg, param="dimensions")
    granted = routes.scheduling(request, None, None)
    result = await runtime.infer(
        InferenceCall(texts, None, granted.priority, granted.timeout_ms, truncate=False)
    )
    handler = result.model.handler
    tokens = sum(handler.preprocess(text, truncate=False).length for text in texts)
    answer: EmbeddingList = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _vector(item, body.encoding_format)}
            for i, item in enumerate(result.results)
        ],
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return json_response(answer)


def register_embeddings(app: FastAPI, routes: Routes) -> None:
    """Mount `POST /v1/embeddings` on `app`, over the inference routes' runtime and limits."""

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await _embed(routes, request)
        except Exception as error:  # domain errors, and bugs answered as a 500 with an error id
            response = openai_failure(error, prompt_param="input").response()
        routes.count(None, response.status_code, time.perf_counter() - started)
        return response
