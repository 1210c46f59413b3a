"""vLLM's tokenizer routes: `POST /tokenize` and `POST /detokenize` of the served model.

Clients count tokens before they send a prompt (to stay within the context, to price it)
with the server's own tokenizer, which is the only one that is sure to agree with it:

- `POST /tokenize` `{model, prompt}` (text, tokenised as `/v1/completions` does it) or
  `{model, messages, add_generation_prompt}` (rendered by the chat template as
  `/v1/chat/completions` does it, so the count is what a chat request's `prompt_tokens`
  will be) answers `{count, max_model_len, tokens}`.
- `POST /detokenize` `{model, tokens}` answers `{prompt}`, special tokens skipped.

The prompt takes the generation routes' bounds (`GenerationEngine.tokenize`: no more text
than the context can hold, 400 `context_length_exceeded` otherwise), `tokens` at most the
context's length and each inside the vocabulary. The chat template always ends with the
assistant's turn here, so `add_generation_prompt: false` is refused with a 400 naming it.
Errors, the bearer token and the body limits are the OpenAI routes' (both paths are in
`generation.OPENAI_PATHS`); an unknown model is a 404, an unknown key a 400 naming it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.core.json_limits import check_depth
from fleetserve_runtime.generate.contracts import GenerationRequest, SamplingParams
from fleetserve_runtime.generate.engine import GenerationEngine
from fleetserve_runtime.server.generation_formats import openai_failure
from fleetserve_runtime.server.generation_schemas import TokenId
from fleetserve_runtime.server.http_errors import json_response
from fleetserve_runtime.server.inference_routes import Routes
from fleetserve_runtime.server.openai_requests import (
    MAX_MESSAGES,
    ChatMessageIn,
    prompt_messages,
    refuse_unknown,
    unknown_keys,
)
from fleetserve_runtime.server.schemas import parse_json, validate_body

__all__ = [
    "MAX_DETOKENIZE_TOKENS",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "TokenizeChatRequest",
    "TokenizeCompletionRequest",
    "TokenizeResponse",
    "register_tokenize",
]

MAX_DETOKENIZE_TOKENS = 1 << 17
"""Most token ids one `/detokenize` takes: a bound on the work before the context's own."""

_EXTRA = ConfigDict(extra="allow")


class TokenizeCompletionRequest(BaseModel):
    """`POST /tokenize` of a prompt's text."""

    model_config = _EXTRA

    model: str = Field(min_length=1, max_length=256)
    prompt: str = Field(min_length=1)


class TokenizeChatRequest(BaseModel):
    """`POST /tokenize` of chat messages, as the chat template renders them."""

    model_config = _EXTRA

    model: str = Field(min_length=1, max_length=256)
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    add_generation_prompt: bool = True


class TokenizeResponse(BaseModel):
    """The prompt's token ids, their count and the model's context."""

    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    """`POST /detokenize` body."""

    model_config = _EXTRA

    model: str = Field(min_length=1, max_length=256)
    tokens: list[TokenId] = Field(max_length=MAX_DETOKENIZE_TOKENS)


class DetokenizeResponse(BaseModel):
    """The text of the token ids."""

    prompt: str


_NO_SAMPLING = SamplingParams(max_tokens=None)
"""Tokenising needs a `GenerationRequest`, which carries sampling it does not read."""


def _refuse_unknown(body: BaseModel, messages: list[ChatMessageIn] | None = None) -> None:
    unknown = [(key, key) for key in unknown_keys(body)]
    unknown += [
        (f"messages[{i}].{key}", f"messages.{i}.{key}")
        for i, message in enumerate(messages or [])
        for key in unknown_keys(message)
    ]
    refuse_unknown(unknown)


def _tokenize_request(data: object) -> GenerationRequest:
    """The prompt `data` names, as the generation routes would tokenise it."""
    if isinstance(data, dict) and "messages" in data:
        chat = validate_body(data, TokenizeChatRequest)
        _refuse_unknown(chat, chat.messages)
        if not chat.add_generation_prompt:
            msg = "add_generation_prompt=false is not supported: the chat template ends with "
            msg += "the assistant's turn"
            raise InvalidInput(msg, param="add_generation_prompt")
        messages = tuple(prompt_messages(chat.messages))
        return GenerationRequest(sampling=_NO_SAMPLING, messages=messages)
    text = validate_body(data, TokenizeCompletionRequest)
    _refuse_unknown(text)
    return GenerationRequest(sampling=_NO_SAMPLING, prompt=text.prompt)


class _TokenizeRoutes:
    def __init__(self, host: Routes) -> None:
        self.host = host

    def engine(self) -> GenerationEngine:
        """The active version's engine; `InvalidInput` naming `model` for an encoder."""
        engine = self.host.rt.model(None).engine
        if not isinstance(engine, GenerationEngine):
            msg = f"model {self.host.name!r} serves embeddings, it has no generation tokenizer"
            raise InvalidInput(msg, param="model")
        return engine

    async def answer(self, request: Request, work: Callable[[object], BaseModel]) -> Response:
        started = time.perf_counter()
        try:
            data = parse_json(await self.host.body(request))
            check_depth(data)
            body = work(data).model_dump()
        except Exception as error:  # domain errors, and bugs answered as a 500 with an error id
            failure = openai_failure(error, prompt_param="prompt")
            self.host.count(None, failure.status, time.perf_counter() - started)
            return failure.response()
        self.host.count(None, 200, time.perf_counter() - started)
        return json_response(body)

    def tokenize(self, data: object) -> TokenizeResponse:
        generation = _tokenize_request(data)
        self.host.check_name(str(data["model"]) if isinstance(data, dict) else "")
        engine = self.engine()
        tokens = engine.tokenize(generation)
        return TokenizeResponse(
            count=len(tokens), max_model_len=engine.context_length, tokens=tokens
        )

    def detokenize(self, data: object) -> DetokenizeResponse:
        body = validate_body(data, DetokenizeRequest)
        _refuse_unknown(body)
        self.host.check_name(body.model)
        return DetokenizeResponse(prompt=self.engine().detokenize(body.tokens))


def register_tokenize(app: FastAPI, host: Routes) -> None:
    """Mount `POST /tokenize` and `POST /detokenize` on `app`."""
    routes = _TokenizeRoutes(host)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        return await routes.answer(request, routes.tokenize)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        return await routes.answer(request, routes.detokenize)
