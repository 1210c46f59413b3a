"""The semantic cache at the OpenAI generation routes: a thin adapter over `core.semantic_cache`.

`SemanticAnswers.generate` stands where the chat and completions routes call
`ServingFacade.generate`, and returns a `GenerationEvents` like it:

- A sampled request (temperature above 0) bypasses the cache: it is generated, never looked
  up or stored, and counted as `bypass`. Its answer is one draw among many; serving it again
  would change the distribution the caller asked for. So does a greedy request with `n` > 1
  (an answer here is one choice), and one that sets any other sampling field away from its
  default (log-probabilities, `echo`, penalties, `logit_bias`, `min_p`, `min_tokens`,
  `stop_token_ids`, ...): the cached answer carries none of what it asks for, or is not the
  plain greedy one. Only the fields the key holds (`max_tokens`, stop strings, `ignore_eos`)
  and those greedy decoding ignores (`top_p`, `top_k`, `seed`) may differ; a field added to
  `SamplingParams` later bypasses by itself.
- A greedy request's prompt is tokenised and checked as the engine does it (the same
  refusals: a prompt that cannot fit is refused, hit or not), then looked up: an exact
  repeat first, then a similar prompt. The similarity compares the embedding of the prompt
  (completions) or of the last message (chat) from the configured encoder, run on the CPU
  beside the served model; everything else that shapes the answer must match exactly: the
  chat's earlier messages and the last one's role, the effective `max_tokens`, the stop
  strings, `ignore_eos`, and `cache_salt` (a salted request shares answers only with its
  salt, as it shares prefix-cache blocks). Prompts of token ids are matched exactly only.
- A hit is a stream of one text event and the finish event, written by `sse` as any
  generation: a whole answer, or a stream of one content chunk between the usual opening
  and closing chunks. Its usage counts this request's prompt tokens and the cached answer's
  completion tokens; `cached_tokens` stays 0, because it counts prompt tokens whose KV
  blocks the prefix cache supplied, and a hit computed no KV at all.
- A miss is generated; the answer is stored once its stream finishes (not when it fails or
  the client leaves), unless another load took the version's place meanwhile.

Keys carry the loaded version's label and load generation, so a new version never serves
an old version's answer. The tenant partitions the entries (`Query.tenant`): the routes
pass the request's tenant name, or None on a server without a tenants table.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from fleetserve_runtime.core.config_sections import SemanticCacheConfig
from fleetserve_runtime.core.metrics import SemanticCacheOutcome
from fleetserve_runtime.core.semantic_cache import Query, SemanticCache
from fleetserve_runtime.encoder.executor import resolve_device
from fleetserve_runtime.generate.contracts import (
    FinishEvent,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
    Usage,
    is_greedy,
)
from fleetserve_runtime.generate.prompts import INLINE_PROMPT_CHARS, PromptProcessor, prompt_chars
from fleetserve_runtime.models.accuracy import embed_texts
from fleetserve_runtime.models.base import ModelHandler
from fleetserve_runtime.models.generative import GenerativeHandler
from fleetserve_runtime.models.registry import KVFigures, LoadedModel, resolve_handler
from fleetserve_runtime.serving.facade import GenerationEvents, ServingFacade

__all__ = ["CachedAnswer", "SemanticAnswers"]

ENCODER_MAX_TOKENS = 256
"""Longest text the encoder embeds; a longer prompt is embedded from its first tokens."""
MAX_PROCESSORS = 4
"""Prompt processors kept, one per load generation: the oldest load's goes first."""
ANSWER_OVERHEAD_BYTES = 64
"""What one cached answer holds besides its text's bytes (its finish reason and counts)."""


_KEYED_OR_IGNORED = frozenset(
    {"max_tokens", "stop", "ignore_eos", "temperature", "top_p", "top_k", "seed"}
)
"""Sampling fields a cached answer may differ in: the key holds the first three, and greedy
decoding ignores the rest (the temperature is checked on its own)."""
_PLAIN = SamplingParams(max_tokens=None)


def _plain_greedy(request: GenerationRequest) -> bool:
    """Whether a cached answer may stand for this request's: greedy, one choice, no more."""
    sampling = request.sampling
    return (
        request.n <= 1
        and is_greedy(sampling.temperature)
        and all(
            getattr(sampling, field.name) == getattr(_PLAIN, field.name)
            for field in fields(sampling)
            if field.name not in _KEYED_OR_IGNORED
        )
    )


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """A finished greedy generation, as a hit replays it."""

    text: str
    reason: FinishReason
    completion_tokens: int


def _answer_bytes(answer: CachedAnswer) -> int:
    return len(answer.text.encode()) + ANSWER_OVERHEAD_BYTES


class _Replay:
    """A hit as a `GenerationEvents`: the whole text as one event, then the finish event."""

    def __init__(self, answer: CachedAnswer, prompt_tokens: int) -> None:
        self._answer = answer
        self._prompt_tokens = prompt_tokens

    @property
    def prompt_tokens(self) -> int:
        return self._prompt_tokens

    async def __aiter__(self) -> AsyncIterator[GenerationEvent]:
        answer = self._answer
        if answer.text:
            yield TokenEvent(answer.text)
        yield FinishEvent(answer.reason, Usage(self._prompt_tokens, answer.completion_tokens))

    async def aclose(self) -> None:
        """Nothing to cancel."""


class _Recording:
    """An engine's stream passed through; its text handed to `store` when it finishes."""

    def __init__(self, inner: GenerationEvents, store: Callable[[CachedAnswer], None]) -> None:
        self._inner = inner
        self._store = store

    @property
    def prompt_tokens(self) -> int:
        return self._inner.prompt_tokens

    async def __aiter__(self) -> AsyncIterator[GenerationEvent]:
        texts: list[str] = []
        async for event in self._inner:
            if isinstance(event, TokenEvent):
                texts.append(event.text)
            elif isinstance(event, FinishEvent):
                self._store(
                    CachedAnswer("".join(texts), event.reason, event.usage.completion_tokens)
                )
            yield event

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass(frozen=True, slots=True)
class _Lookup:
    """A greedy request's cache query, its embedding text and its counted prompt tokens."""

    query: Query
    text: str | None
    prompt_tokens: int


class SemanticAnswers:
    """The semantic cache of one served model name; `load` the encoder before serving."""

    def __init__(self, config: SemanticCacheConfig, *, model: str, default_max_tokens: int) -> None:
        self._config = config
        self._model = model
        self._default_max_tokens = default_max_tokens
        self._cache: SemanticCache[CachedAnswer] = SemanticCache(
            max_entries=config.max_entries,
            max_bytes=config.max_bytes,
            min_similarity=config.min_similarity,
            size_of=_answer_bytes,
        )
        self._encoder: ModelHandler | None = None
        self._device = resolve_device("cpu")
        self._embedding = asyncio.Lock()
        """One embedding at a time: each already uses the encoder's threads."""
        self._prompts: dict[int, PromptProcessor] = {}
        """By load generation: the served versions' prompt processors."""

    async def load(self) -> None:
        """Load the encoder off the event loop; `ValueError` when its URI is no encoder."""
        self._encoder = await asyncio.to_thread(self._load_encoder)

    def _load_encoder(self) -> ModelHandler:
        uri = self._config.encoder
        if uri is None:
            msg = "semantic_cache.encoder is not set"
            raise ValueError(msg)
        handler = resolve_handler(
            uri,
            name="semantic-cache-encoder",
            version="1",
            max_sequence_length=ENCODER_MAX_TOKENS,
            device="cpu",
            task="embed",
        )
        if isinstance(handler, GenerativeHandler):
            msg = f"semantic_cache.encoder {uri!r} generates text; name an encoder"
            raise ValueError(msg)
        handler.load(self._device)
        return handler

    async def generate(
        self, rt: ServingFacade, request: GenerationRequest, *, tenant: str | None
    ) -> GenerationEvents:
        """Answer from the cache, or generate (storing a greedy answer); see the module doc."""
        loaded = rt.model(request.version)
        handler, kv = loaded.generative, loaded.kv
        if handler is None or kv is None:
            return await rt.generate(request)  # refused: the version does not generate
        if not _plain_greedy(request):
            rt.metrics.observe_semantic_cache(loaded.version, "bypass")
            return await rt.generate(request)
        prompts = self._processor(loaded, handler, kv)
        lookup = await self._lookup(loaded, prompts, request, tenant)
        hit = self._cache.exact(lookup.query)
        embedding = None
        if hit is None and lookup.text is not None:
            embedding = await self._embed(lookup.text)
            hit = self._cache.similar(lookup.query, embedding)
        outcome: SemanticCacheOutcome = (
            "miss" if hit is None else "exact_hit" if hit.exact else "semantic_hit"
        )
        rt.metrics.observe_semantic_cache(loaded.version, outcome)
        if hit is not None:
            return _Replay(hit.value, lookup.prompt_tokens)
        # Read right before `generate`, which picks its version before its first await: the
        # version that answers. Another load since the lookup makes the query's key stale.
        if rt.model(request.version).generation != loaded.generation:
            return await rt.generate(request)
        stream = await rt.generate(request)
        return _Recording(stream, lambda answer: self._cache.put(lookup.query, embedding, answer))

    async def _lookup(
        self,
        loaded: LoadedModel,
        prompts: PromptProcessor,
        request: GenerationRequest,
        tenant: str | None,
    ) -> _Lookup:
        """Tokenise and check the prompt as the engine will; the query it is cached under."""
        if prompt_chars(request) <= INLINE_PROMPT_CHARS:
            ids = prompts.tokenise(request)
        else:
            ids = await asyncio.to_thread(prompts.tokenise, request)
        sampling = request.sampling
        max_tokens = sampling.max_tokens or prompts.default_max_tokens(
            len(ids), self._default_max_tokens
        )
        prompts.check_fits(len(ids), max_tokens)
        params: dict[str, Any] = {
            "max_tokens": max_tokens,
            "stop": list(sampling.stop),
            "ignore_eos": sampling.ignore_eos,
            "cache_salt": request.cache_salt,
        }
        text: str | None
        prompt: object
        if request.messages is not None:
            *earlier, last = request.messages
            params["chat"] = [[m.role, m.content] for m in earlier] + [[last.role]]
            text = prompt = last.content
        elif request.prompt is not None:
            text = prompt = request.prompt
        else:
            text, prompt = None, list(request.prompt_token_ids or ())
        query = Query(
            model=self._model,
            version=f"{loaded.version}#{loaded.generation}",
            tenant=tenant,
            params=params,
            prompt=prompt,
        )
        return _Lookup(query, text, len(ids))

    def _processor(
        self, loaded: LoadedModel, handler: GenerativeHandler, kv: KVFigures
    ) -> PromptProcessor:
        """The version's prompt processor, as its engine has it (built once per load)."""
        processor = self._prompts.get(loaded.generation)
        if processor is None:
            if len(self._prompts) >= MAX_PROCESSORS:
                self._prompts.pop(min(self._prompts))
            processor = self._prompts[loaded.generation] = PromptProcessor(
                codec=handler.codec,
                vocab_size=handler.lm.vocab_size,
                context_length=handler.context_length,
                kv_capacity=kv.token_capacity,
            )
        return processor

    async def _embed(self, text: str) -> npt.NDArray[np.float32]:
        encoder = self._encoder
        if encoder is None:
            msg = "the semantic cache's encoder is not loaded"
            raise RuntimeError(msg)
        async with self._embedding:
            rows = await asyncio.to_thread(embed_texts, encoder, [text], self._device)
        embedding: npt.NDArray[np.float32] = rows[0]
        return embedding
