"""The generative engine: requests in, model steps on one worker thread, token events out.

This is the event loop's side; the worker's is the engine core (`engine_core`). `submit`
tokenises the prompt (`prompts`; a long one on a helper thread: near the context's bound in
characters it takes the tokenizer most of a second, which would stall every stream's
events), compiles its output grammar, if any (`grammar`, on a helper thread too), checks it against
the context and the KV pool, refuses with `QueueFull` when the
waiting queue is at its bound (`core.queueing`) and hands the new request to the core,
with its tenant (`core.tenants.CURRENT_TENANT`: fair share, and a cache salt of its own);
nothing else of a request runs on the event loop. Each request's events come back through
its `GenerationStream` (`stream`), whose deadline and `aclose` cancel it in the core.

Liveness watches the worker as it watches the encoder executor: `running_step` is the step
in progress with the time it should take, and `worker_died` says the thread ended while it
should run.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field, replace

from fleetserve_runtime.core.errors import InvalidInput, ModelNotReady
from fleetserve_runtime.core.liveness import RunningBatch
from fleetserve_runtime.core.queueing import QueueBound, resolve_timeout
from fleetserve_runtime.core.tenants import CURRENT_TENANT
from fleetserve_runtime.generate.blocks import salt_root
from fleetserve_runtime.generate.contracts import GenerationRequest, SamplingParams
from fleetserve_runtime.generate.engine_core import EngineCore, EngineStats
from fleetserve_runtime.generate.grammar import GrammarCompiler, GrammarState
from fleetserve_runtime.generate.limits import EngineLimits
from fleetserve_runtime.generate.logprobs import MAX_TOP_LOGPROBS
from fleetserve_runtime.generate.metrics import GenerationMetrics
from fleetserve_runtime.generate.prompts import INLINE_PROMPT_CHARS, PromptProcessor, prompt_chars
from fleetserve_runtime.generate.request import Choices, EngineRequest
from fleetserve_runtime.generate.sampling import RowSampling
from fleetserve_runtime.generate.sequence import Seq
from fleetserve_runtime.generate.stops import StopMatcher
from fleetserve_runtime.generate.stream import GenerationStream
from fleetserve_runtime.models.causal_lm import CausalLM, TextCodec

__all__ = ["GenerationEngine"]


@dataclass(eq=False, kw_only=True)
class GenerationEngine:
    """Serves `GenerationRequest`s of one loaded model; see the module docstring."""

    lm: CausalLM
    codec: TextCodec
    limits: EngineLimits
    metrics: InitVar[GenerationMetrics]
    context_length: int
    clock: Callable[[], float] = time.monotonic
    version: str = ""
    _core: EngineCore = field(init=False)
    _prompts: PromptProcessor = field(init=False)
    _grammars: GrammarCompiler = field(init=False)
    _queue: QueueBound = field(init=False)
    _ids: itertools.count[int] = field(default_factory=itertools.count, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _open_streams: int = field(default=0, init=False)

    def __post_init__(self, metrics: GenerationMetrics) -> None:
        self._core = EngineCore(
            lm=self.lm,
            codec=self.codec,
            limits=self.limits,
            metrics=metrics.for_version(self.version),
            context_length=self.context_length,
            clock=self.clock,
        )
        self._prompts = PromptProcessor(
            codec=self.codec,
            vocab_size=self.lm.vocab_size,
            context_length=self.context_length,
            kv_capacity=self.limits.num_blocks * self.limits.block_size,
        )
        self._grammars = GrammarCompiler(self.codec, self.lm.vocab_size)
        self._queue = QueueBound(self.limits.max_queue_size, self.limits.retry_after_s)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Allocate the model's KV pool and start the worker thread."""
        self.lm.allocate_cache(self.limits.num_blocks, self.limits.block_size)
        self._thread = threading.Thread(
            target=self._core.run, name="fleetserve-generate", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        """Stop the worker after its current step; fail every waiting and running stream."""
        self._core.request_stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        # The worker is gone: its state is the event loop's to clear now.
        self._core.abort_all(ModelNotReady("server is shutting down"))

    @property
    def is_running(self) -> bool:
        """True while the worker runs and new requests are accepted (not once it died)."""
        thread = self._thread
        return thread is not None and not self._core.stopping and thread.is_alive()

    @property
    def worker_died(self) -> bool:
        """True when the worker thread ended although the engine was never stopped."""
        thread = self._thread
        return thread is not None and not self._core.stopping and not thread.is_alive()

    def running_step(self) -> RunningBatch | None:
        """The step the worker is in now; None while it is idle or has no thread.

        Its start is on the `time.perf_counter` clock, as the executor's batches are, and
        its expected time comes from the pace of the steps before it (`StepPace`). A step
        that keeps a stopping engine from stopping counts too.
        """
        if self._thread is None or not self._thread.is_alive():
            return None
        return self._core.running_step

    def stats(self) -> EngineStats:
        """The state after the last step."""
        return self._core.stats()

    @property
    def open_streams(self) -> int:
        """Streams submitted and not yet ended, counted on the event loop.

        Unlike `stats()`, which a step publishes, it counts a request from the moment
        `submit` returns, so whoever waits for an engine to drain never misses one that has
        not reached a step yet.
        """
        return self._open_streams

    # -- requests ----------------------------------------------------------------------

    async def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queue a generation; raises before any event when it cannot be served."""
        self._check_running()
        # Before tokenising: an overloaded server refuses at the least cost.
        self._queue.check(self._core.num_waiting)
        params = request.sampling
        # With echo, 0 asks for the prompt alone (its log-probabilities: a scoring request).
        least = 0 if params.echo else 1
        if params.max_tokens is not None and params.max_tokens < least:
            msg = f"max_tokens must be at least {least}, got {params.max_tokens}"
            raise InvalidInput(msg)
        for name, top in (
            ("logprobs", params.logprobs),
            ("prompt_logprobs", params.prompt_logprobs),
        ):
            # Checked here, not in the step: there a bad width would fail every sequence.
            if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
                msg = f"{name} must lie in 0..{MAX_TOP_LOGPROBS}, got {top}"
                raise InvalidInput(msg)
        self._check_token_ids(params)
        grammars = await self._grammar_states(params, max(request.n, 1))
        if prompt_chars(request) <= INLINE_PROMPT_CHARS:
            prompt = self._prompts.tokenise(request)
        else:
            prompt = await asyncio.to_thread(self._prompts.tokenise, request)
            self._check_running()  # it may have stopped while the prompt was tokenised
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = self._prompts.default_max_tokens(
                len(prompt), self.limits.default_max_tokens
            )
        self._prompts.check_fits(len(prompt), max_tokens)
        timeout_s = resolve_timeout(
            request.timeout_s,
            default=self.limits.default_timeout_s,
            maximum=self.limits.max_timeout_s,
            refusal="timeout must be between 0 and {maximum:g}s, got {requested:g}",
        )
        # Again: others may have queued while a long prompt was tokenised.
        self._queue.check(self._core.num_waiting)
        tenant = CURRENT_TENANT.get()
        arrived_at = self.clock()
        cache_root = salt_root(request.cache_salt, None if tenant is None else tenant.name)
        stream = GenerationStream(
            prompt_tokens=len(prompt), request_id=request.request_id, on_end=self._stream_ended
        )
        self._open_streams += 1
        works: list[EngineRequest] = []
        for index in range(max(request.n, 1)):
            # Of `n` > 1 choices the first alone computes the prompt's log-probabilities.
            scores_prompt = index == 0 and params.prompt_logprobs is not None
            seq = Seq(
                next(self._ids),
                list(prompt),
                len(prompt),
                priority=request.priority,
                arrived_at=arrived_at,
                cache_root=cache_root,
                tenant=tenant,
                fair_cost=len(prompt) + max_tokens,
                prompt_logits=scores_prompt and len(prompt) > 1,
            )
            # vLLM's: a seeded request's choice i draws from seed + i, so they differ.
            seed = None if params.seed is None else params.seed + index
            sampling = RowSampling.of(
                replace(params, seed=seed), self.codec.eos_token_ids, grammars[index]
            )
            decoder = self.codec.decoder()
            stops = StopMatcher(params.stop)
            works.append(
                EngineRequest(
                    seq,
                    stream,
                    params,
                    sampling,
                    decoder,
                    stops,
                    max_tokens,
                    prompt_logprobs=[None] if scores_prompt else None,
                    index=index,
                )
            )
        work = works[0]
        if len(works) > 1:
            choices = Choices(members=works, pending=works[1:], remaining=len(works))
            for member in works:
                member.choices = choices
        stream.watch(timeout_s, lambda: self._core.cancel(work))
        self._core.add(work)
        return stream

    # -- tokenizer routes --------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Token ids of the model are 0 to `vocab_size - 1`."""
        return self.lm.vocab_size

    def tokenize(self, request: GenerationRequest) -> list[int]:
        """The token ids `submit` would compute for the request's prompt, under its bounds."""
        return self._prompts.tokenise(request)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, special tokens skipped (`tokens`: ids in the vocabulary)."""
        vocab = self.lm.vocab_size
        wrong = [token for token in token_ids if not 0 <= token < vocab]
        if wrong:
            msg = f"tokens: token id {wrong[0]} is not in the vocabulary (0 to {vocab - 1})"
            raise InvalidInput(msg, param="tokens")
        return self.codec.decode(token_ids)

    def _check_token_ids(self, params: SamplingParams) -> None:
        """`InvalidInput` naming `logit_bias` or `stop_token_ids` for an id past the vocabulary."""
        vocab = self.lm.vocab_size
        for param, ids in (
            ("logit_bias", [token for token, _ in params.logit_bias]),
            ("stop_token_ids", params.stop_token_ids),
        ):
            wrong = [token for token in ids if not 0 <= token < vocab]
            if wrong:
                msg = f"{param}: token id {wrong[0]} is not in the vocabulary (0 to {vocab - 1})"
                raise InvalidInput(msg, param=param)

    async def _grammar_states(
        self, params: SamplingParams, count: int
    ) -> list[GrammarState | None]:
        """Each choice's own state of the output grammar (None each without one).

        Compiled on a helper thread: a large schema takes the compiler most of a second.
        """
        grammar = params.grammar
        if grammar is None:
            return [None] * count
        if params.min_tokens:
            # Where the grammar ends the text, only end-of-sequence may follow: holding it
            # back would leave no token to sample.
            msg = f"min_tokens cannot be combined with {grammar.field}"
            raise InvalidInput(msg, param="min_tokens")
        states = await asyncio.to_thread(self._grammars.states, grammar, count)
        self._check_running()
        return list(states)

    def _check_running(self) -> None:
        if not self.is_running:
            msg = "the generation engine is not running"
            raise ModelNotReady(msg)

    def _stream_ended(self) -> None:
        self._open_streams -= 1
