"""The generative engine: requests in, model steps on one worker thread, token events out.

The event loop side (`submit`) tokenises the prompt (a long one on a helper thread: near the
context's bound in characters it takes the tokenizer most of a second, which would stall
every stream's events), checks it against the context and the KV pool, refuses with
`QueueFull` when the waiting queue is at its bound and hands the new sequence to the worker;
nothing else of a request runs on the event loop. The worker thread loops: take new and
cancelled sequences in, let the `Scheduler` plan a step, run `CausalLM.forward` on it, sample
the sequences whose chunk reached their end, decode the new tokens to text (stop strings
cut), retire finished sequences at once, and post each step's events to the event loop in
one hop. A model step that raises fails the sequences of that step, not the engine; decoding
that raises for one sequence fails that sequence alone.

Liveness watches the worker as it watches the encoder executor: `running_step` is the step
in progress (from taking new work in to posting its events) with the time it should take
from the pace of recent steps, and `worker_died` says the thread ended while it should run.

Each `GenerationStream` is an async iterator of events. Its deadline runs on the event loop
(a timer), so a 504 is not late by a step: before the first token it is raised from the
iterator, after it an `ErrorEvent` ends the stream; either way the sequence leaves the
scheduler at the worker's next step boundary, as a cancelled (`aclose`) one does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fleetserve_runtime.core.errors import (
    BatchFailed,
    DeadlineExceeded,
    InputTooLong,
    InvalidInput,
    ModelNotReady,
    QueueFull,
)
from fleetserve_runtime.core.limits import MAX_CHARS_PER_TOKEN
from fleetserve_runtime.core.liveness import RunningBatch
from fleetserve_runtime.generate.blocks import BlockPool
from fleetserve_runtime.generate.contracts import (
    ErrorEvent,
    FinishEvent,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
    Usage,
)
from fleetserve_runtime.generate.metrics import GenerationMetrics, VersionGenerationMetrics
from fleetserve_runtime.generate.sampling import RowSampling, sample
from fleetserve_runtime.generate.scheduler import Policy, Scheduler, SchedulerLimits, Seq, StepPlan
from fleetserve_runtime.generate.stops import StopMatcher
from fleetserve_runtime.models.causal_lm import (
    CausalLM,
    IncrementalDecoder,
    SeqChunk,
    StepInput,
    TextCodec,
)

__all__ = [
    "INLINE_PROMPT_CHARS",
    "EngineLimits",
    "EngineStats",
    "GenerationEngine",
    "GenerationStream",
    "StepPace",
]

log = logging.getLogger("fleetserve.generate")

IDLE_POLL_S = 0.05
"""How long the worker sleeps when sequences wait but none can be scheduled (never expected:
`submit` refuses what cannot fit alone); it keeps such a bug from spinning a core."""


_CONTROL_TOKEN_BYTES = 32
"""Floor of `_longest_token_bytes`: a chat template's control tokens (`<|im_start|>`) are
single tokens of up to this many bytes of rendered text, and decode to nothing."""

INLINE_PROMPT_CHARS = 4096
"""Prompts up to this many characters are tokenised on the event loop (well under a
millisecond); longer ones on a helper thread, which the tokenizer's GIL-free encoding lets
run beside the loop. A hop for every request would cost more than short prompts do."""


def _prompt_chars(request: GenerationRequest) -> int:
    if request.messages is not None:
        return sum(len(message.content) for message in request.messages)
    return len(request.prompt or "")


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The engine's knobs; see the scheduler's docstring for how they interact."""

    block_size: int = 16
    num_blocks: int = 1024
    max_running_sequences: int = 32
    max_step_tokens: int = 512
    """Tokens per model step (decodes first, then prefill chunks): the TTFT / inter-token
    latency knob. Larger prefills prompts in fewer steps; smaller keeps steps short."""
    max_queue_size: int = 256
    default_max_tokens: int = 512
    """Output tokens of a request that sets none, fewer where the context leaves less room:
    running to the full context would let one caller hold a sequence slot for minutes."""
    default_timeout_s: float = 60.0
    max_timeout_s: float = 600.0
    priority_aging_s: float = 5.0
    retry_after_s: float = 1.0
    prefix_caching: bool = True
    policy: Policy = "continuous"

    def __post_init__(self) -> None:
        positive = {
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "max_running_sequences": self.max_running_sequences,
            "max_step_tokens": self.max_step_tokens,
            "max_queue_size": self.max_queue_size,
            "default_max_tokens": self.default_max_tokens,
        }
        for name, value in positive.items():
            if value < 1:
                msg = f"{name} must be at least 1, got {value}"
                raise ValueError(msg)
        if self.max_step_tokens < self.max_running_sequences:
            # Every running stream decodes one token per step: the budget must cover them.
            msg = (
                f"max_step_tokens ({self.max_step_tokens}) must be at least "
                f"max_running_sequences ({self.max_running_sequences})"
            )
            raise ValueError(msg)
        if not 0 < self.default_timeout_s <= self.max_timeout_s:
            msg = "default_timeout_s must be positive and at most max_timeout_s"
            raise ValueError(msg)
        if self.policy not in ("continuous", "static"):
            msg = f"policy must be 'continuous' or 'static', got {self.policy!r}"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine's state after its last step."""

    running: int
    waiting: int
    kv_usage_ratio: float
    num_blocks: int
    free_blocks: int
    cached_blocks: int
    block_size: int
    preemptions: int
    prefix_cache_hit_tokens: int
    prefix_cache_query_tokens: int
    steps: int


@dataclass(slots=True)
class StepPace:
    """Moving averages of a step's seconds and of its seconds per scheduled token.

    A step costs a pass over the weights whatever its batch, plus time per prefill token. The
    next step is expected to take the larger of the two guesses, so neither a lone decode
    after wide batches nor a long prefill after decodes is mistaken for a stuck one.
    """

    step_s: float = 0.0
    per_token_s: float = 0.0
    alpha: float = 0.2

    def expected_s(self, tokens: int) -> float | None:
        """Seconds a step of `tokens` should take; None before any step was measured."""
        if not self.step_s:
            return None
        return max(self.step_s, self.per_token_s * tokens)

    def update(self, seconds: float, tokens: int) -> None:
        """Fold one finished step into the averages."""
        per_token = seconds / max(tokens, 1)
        if not self.step_s:
            self.step_s, self.per_token_s = seconds, per_token
            return
        self.step_s += self.alpha * (seconds - self.step_s)
        self.per_token_s += self.alpha * (per_token - self.per_token_s)


class GenerationStream:
    """Events of one generation, as an async iterator; `aclose` cancels it.

    An error before the first `TokenEvent` is raised from the iterator (the caller can still
    answer with a status code); after it, an `ErrorEvent` is the stream's last event.
    """

    def __init__(
        self, engine: GenerationEngine, *, prompt_tokens: int, request_id: str | None
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.request_id = request_id
        self._engine = engine
        self._loop = asyncio.get_running_loop()
        self._events: deque[GenerationEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._started = False
        self._timer: asyncio.TimerHandle | None = None
        self._work: _Work | None = None

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        while not self._events:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        event = self._events.popleft()
        if isinstance(event, ErrorEvent) and not self._started:
            raise event.error
        if isinstance(event, TokenEvent):
            self._started = True
        return event

    async def aclose(self) -> None:
        """Stop generating: the sequence leaves the batch at the next step and frees its blocks."""
        if not self._ended:
            self._end()
            if self._work is not None:
                self._engine._cancel(self._work)
        self._events.clear()

    def _push(self, events: Iterable[GenerationEvent]) -> None:
        """Queue events (on the event loop); the stream ends at a finish or error event."""
        if self._ended:
            return
        for event in events:
            self._events.append(event)
            if not isinstance(event, TokenEvent):
                self._end()
                break
        self._wake()

    def _expire(self, timeout_s: float) -> None:
        if self._ended:
            return
        phase = "generating" if self._started or self._events else "before the first token"
        error = DeadlineExceeded(f"deadline of {timeout_s:g}s passed {phase}")
        self._push([ErrorEvent(error)])
        if self._work is not None:
            self._engine._cancel(self._work)

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._engine._stream_ended()
        if self._timer is not None:
            self._timer.cancel()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


@dataclass(slots=True, eq=False)
class _Work:
    """A sequence's state on the worker thread: what decodes, stops and samples its tokens."""

    seq: Seq
    stream: GenerationStream
    params: SamplingParams
    sampling: RowSampling
    decoder: IncrementalDecoder
    stops: StopMatcher
    max_tokens: int
    """`params.max_tokens`, or the default (at most the room the prompt leaves) when unset."""
    generated: int = 0
    last_token_at: float | None = None
    counted: bool = False
    """Its prompt tokens went into the metrics (at the first admission)."""
    pending_ids: list[int] = field(default_factory=list)
    """Token ids whose text is still held back (an open character or a possible stop)."""


class GenerationEngine:
    """Serves `GenerationRequest`s of one loaded model; see the module docstring."""

    def __init__(
        self,
        *,
        lm: CausalLM,
        codec: TextCodec,
        limits: EngineLimits,
        metrics: GenerationMetrics,
        context_length: int,
        clock: Callable[[], float] = time.monotonic,
        version: str = "",
    ) -> None:
        self._lm = lm
        self._codec = codec
        self.limits = limits
        self.context_length = context_length
        self.version = version
        self._clock = clock
        self._metrics: VersionGenerationMetrics = metrics.for_version(version)
        self._pool = BlockPool(
            limits.num_blocks, limits.block_size, prefix_caching=limits.prefix_caching
        )
        self._scheduler = Scheduler(
            self._pool,
            SchedulerLimits(
                max_running_sequences=limits.max_running_sequences,
                max_step_tokens=limits.max_step_tokens,
                priority_aging_s=limits.priority_aging_s,
                policy=limits.policy,
            ),
        )
        self._wake = threading.Condition()
        self._inbox: list[_Work] = []
        self._cancelled: list[_Work] = []
        self._work: dict[int, _Work] = {}
        """Sequences the worker owns, by id (the worker's alone while it runs)."""
        self._outbox: list[tuple[GenerationStream, list[GenerationEvent]]] = []
        """Events of the current step, posted to the event loop once it is accounted."""
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._steps = 0
        self._pace = StepPace()
        self._running: RunningBatch | None = None
        """The step in progress (start on the `perf_counter` clock); None while idle."""
        self._seen = (0, 0, 0)
        """Preemptions, prefix hit and query tokens already counted into the metrics."""
        self._stats = self._snapshot()
        self._open_streams = 0
        self._token_bytes = _longest_token_bytes(codec, lm.vocab_size)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Allocate the model's KV pool and start the worker thread."""
        self._lm.allocate_cache(self.limits.num_blocks, self.limits.block_size)
        self._thread = threading.Thread(target=self._run, name="fleetserve-generate", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop the worker after its current step; fail every waiting and running stream."""
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        # The worker is gone: its state is the event loop's to clear now.
        error = ModelNotReady("server is shutting down")
        for work in self._work.values():
            self._scheduler.finish(work.seq)
        pending = [*self._work.values(), *self._inbox]
        self._work.clear()
        self._inbox.clear()
        for work in pending:
            _post(work.stream, [ErrorEvent(error)])
        self._stats = self._snapshot()

    @property
    def is_running(self) -> bool:
        """True while the worker runs and new requests are accepted (not once it died)."""
        return self._thread is not None and not self._stopping and self._thread.is_alive()

    @property
    def worker_died(self) -> bool:
        """True when the worker thread ended although the engine was never stopped."""
        return self._thread is not None and not self._stopping and not self._thread.is_alive()

    def running_step(self) -> RunningBatch | None:
        """The step the worker is in now; None while it is idle or has no thread.

        Its start is on the `time.perf_counter` clock, as the executor's batches are, and
        its expected time comes from the pace of the steps before it (`StepPace`). A step
        that keeps a stopping engine from stopping counts too.
        """
        if self._thread is None or not self._thread.is_alive():
            return None
        return self._running

    def stats(self) -> EngineStats:
        """The state after the last step."""
        return self._stats

    @property
    def open_streams(self) -> int:
        """Streams submitted and not yet ended, counted on the event loop.

        Unlike `stats()`, which a step publishes, it counts a request from the moment
        `submit` returns, so whoever waits for an engine to drain never misses one that has
        not reached a step yet.
        """
        return self._open_streams

    def _stream_ended(self) -> None:
        self._open_streams -= 1

    # -- requests ----------------------------------------------------------------------

    async def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queue a generation; raises before any event when it cannot be served."""
        self._check_running()
        # Before tokenising: an overloaded server refuses at the least cost.
        self._check_queue()
        params = request.sampling
        if params.max_tokens is not None and params.max_tokens < 1:
            msg = f"max_tokens must be at least 1, got {params.max_tokens}"
            raise InvalidInput(msg)
        if _prompt_chars(request) <= INLINE_PROMPT_CHARS:
            prompt = self._tokenise(request)
        else:
            prompt = await asyncio.to_thread(self._tokenise, request)
            self._check_running()  # it may have stopped while the prompt was tokenised
        max_tokens = params.max_tokens
        if max_tokens is None:
            room = min(self.context_length, self.limits.num_blocks * self.limits.block_size)
            max_tokens = max(1, min(self.limits.default_max_tokens, room - len(prompt)))
        self._check_fits(len(prompt), max_tokens)
        timeout_s = self._timeout_s(request.timeout_s)
        self._check_queue()  # again: others may have queued while a long prompt was tokenised
        seq = Seq(
            next(self._ids),
            list(prompt),
            len(prompt),
            priority=request.priority,
            arrived_at=self._clock(),
        )
        stream = GenerationStream(self, prompt_tokens=len(prompt), request_id=request.request_id)
        self._open_streams += 1
        work = _Work(
            seq,
            stream,
            params,
            RowSampling.of(params),
            self._codec.decoder(),
            StopMatcher(params.stop),
            max_tokens,
        )
        stream._work = work
        stream._timer = asyncio.get_running_loop().call_later(timeout_s, stream._expire, timeout_s)
        with self._wake:
            self._inbox.append(work)
            self._wake.notify()
        return stream

    def _check_queue(self) -> None:
        waiting = self._scheduler.num_waiting + len(self._inbox)
        if waiting >= self.limits.max_queue_size:
            msg = (
                f"queue is full ({waiting} of {self.limits.max_queue_size} waiting); "
                f"retry after {self.limits.retry_after_s:g}s"
            )
            raise QueueFull(msg, retry_after_s=self.limits.retry_after_s)

    def _check_running(self) -> None:
        if not self.is_running:
            msg = "the generation engine is not running"
            raise ModelNotReady(msg)

    def _tokenise(self, request: GenerationRequest) -> list[int]:
        given = [
            x for x in (request.prompt, request.messages, request.prompt_token_ids) if x is not None
        ]
        if len(given) != 1:
            msg = "give exactly one of prompt, messages or prompt token ids"
            raise InvalidInput(msg)
        if request.prompt_token_ids is not None:
            if len(request.prompt_token_ids) > self.context_length:
                msg = (
                    f"prompt of {len(request.prompt_token_ids)} token ids cannot fit the "
                    f"model's context of {self.context_length} tokens"
                )
                raise InputTooLong(msg)
            ids = list(request.prompt_token_ids)
            vocab = self._lm.vocab_size
            if any(not 0 <= token < vocab for token in ids):
                msg = f"prompt token ids must be between 0 and {vocab - 1}"
                # Token ids come only from the completions API's `prompt`.
                raise InvalidInput(msg, param="prompt")
        elif request.messages is not None:
            # The template only adds to the messages' text: bound it before rendering too.
            self._bounded("".join(message.content for message in request.messages))
            try:
                text = self._codec.render_chat(request.messages)
            except ValueError as exc:
                msg = f"the chat template refused the messages: {exc}"
                raise InvalidInput(msg) from None
            try:
                ids = self._codec.encode_chat(request.messages, self._bounded(text))
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
        else:
            ids = self._codec.encode(self._bounded(request.prompt or ""), add_special=True)
        if not ids:
            msg = "the prompt is empty"
            raise InvalidInput(msg)
        return ids

    def _bounded(self, text: str) -> str:
        """Refuse a text that cannot fit before the tokenizer spends the event loop on it.

        Two sound bounds, both cheaper than tokenising: characters against
        `MAX_CHARS_PER_TOKEN`, and UTF-8 bytes against the most bytes one token stands for
        (`_longest_token_bytes`), which catches text of many-byte characters (emoji) that
        passes the first.
        """
        size = len(text)
        if size <= self.context_length * MAX_CHARS_PER_TOKEN:
            size = len(text.encode("utf-8", "surrogatepass"))
            if size <= self.context_length * self._token_bytes:
                return text
            unit = f"bytes (a token of this model stands for at most {self._token_bytes})"
        else:
            unit = "characters"
        msg = (
            f"prompt of {size} {unit} cannot fit the model's context of "
            f"{self.context_length} tokens"
        )
        raise InputTooLong(msg)

    def _check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        total = prompt_tokens + max_tokens
        if total > self.context_length:
            msg = (
                f"prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} is "
                f"{total} tokens, over the model's context of {self.context_length} tokens"
            )
            raise InputTooLong(msg)
        capacity = self.limits.num_blocks * self.limits.block_size
        if total > capacity:
            msg = (
                f"prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} is "
                f"{total} tokens, over the KV cache's {capacity} tokens"
            )
            raise InputTooLong(msg)

    def _timeout_s(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            return self.limits.default_timeout_s
        if not 0 < timeout_s <= self.limits.max_timeout_s:
            msg = f"timeout must be between 0 and {self.limits.max_timeout_s:g}s, got {timeout_s:g}"
            raise InvalidInput(msg)
        return timeout_s

    def _cancel(self, work: _Work) -> None:
        """Called on the event loop: the worker drops `work` at its next step boundary."""
        with self._wake:
            self._cancelled.append(work)
            self._wake.notify()

    # -- the worker thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._stopping or self._inbox or self._cancelled or self._work):
                    self._wake.wait()
                if self._stopping:
                    return
                inbox, self._inbox = self._inbox, []
                cancelled, self._cancelled = self._cancelled, []
            started = time.perf_counter()
            self._running = RunningBatch(started, self._pace.expected_s(0))
            for work in inbox:
                self._work[work.seq.seq_id] = work
                self._scheduler.add(work.seq)
            for work in cancelled:
                if self._work.pop(work.seq.seq_id, None) is not None:
                    self._scheduler.finish(work.seq)
            try:
                tokens = self._step(started)
            except Exception:
                self._fail(list(self._work.values()), "engine step failed")
                tokens = None
            # Stats first: a caller that got its last event sees the blocks already freed.
            self._publish()
            outbox, self._outbox = self._outbox, []
            _deliver(outbox)
            self._running = None
            if tokens:
                self._pace.update(time.perf_counter() - started, tokens)
            elif tokens == 0:
                with self._wake:
                    self._wake.wait(IDLE_POLL_S)

    def _step(self, started: float) -> int | None:
        """Plan and run one step; the tokens it computed (0: nothing to run, None: it failed)."""
        plan = self._scheduler.schedule()
        for seq in plan.admitted:
            work = self._work[seq.seq_id]
            if not work.counted:
                work.counted = True
                self._metrics.prompt_tokens.inc(seq.prompt_len)
        if not plan.chunks:
            return 0
        scheduled = sum(len(chunk.token_ids) for chunk in plan.chunks)
        self._running = RunningBatch(started, self._pace.expected_s(scheduled))
        step = StepInput([SeqChunk(c.token_ids, c.start, c.seq.block_table) for c in plan.chunks])
        try:
            tokens = self._forward(plan, step)
        except Exception:
            self._fail([self._work[chunk.seq.seq_id] for chunk in plan.chunks], "model step failed")
            return None
        self._scheduler.commit(plan, tokens)
        self._steps += 1
        now = self._clock()
        generated = 0
        for chunk, token in zip(plan.chunks, tokens, strict=True):
            if token is None:
                continue
            generated += 1
            work = self._work[chunk.seq.seq_id]
            try:
                events = self._on_token(work, token, now)
            except Exception:
                # Decoding or matching stops failed for this sequence's text alone: the
                # others of the step (and those waiting) keep going.
                self._fail([work], "decoding a generated token failed")
                continue
            self._outbox.append((work.stream, events))
        self._metrics.generation_tokens.inc(generated)
        return scheduled

    def _forward(self, plan: StepPlan, step: StepInput) -> list[int | None]:
        logits = self._lm.forward(step)
        rows = [n for n, chunk in enumerate(plan.chunks) if chunk.samples]
        tokens: list[int | None] = [None] * len(plan.chunks)
        if rows:
            picked = logits if len(rows) == len(plan.chunks) else logits[rows]
            sampling = [self._work[plan.chunks[n].seq.seq_id].sampling for n in rows]
            for n, token in zip(rows, sample(picked, sampling), strict=True):
                tokens[n] = token
        return tokens

    def _on_token(self, work: _Work, token: int, now: float) -> list[GenerationEvent]:
        """Account one new token of `work`; the events it produces (a finish retires it)."""
        metrics = self._metrics
        if work.last_token_at is None:
            metrics.time_to_first_token.observe(now - work.seq.arrived_at)
        else:
            metrics.inter_token_latency.observe(now - work.last_token_at)
        work.last_token_at = now
        work.generated += 1
        params = work.params
        reason: FinishReason | None = None
        text = ""
        if token in self._codec.eos_token_ids and not params.ignore_eos:
            reason = FinishReason.STOP
        else:
            work.pending_ids.append(token)
            text = work.stops.push(work.decoder.push(token))
            if work.stops.stopped:
                reason = FinishReason.STOP
            elif work.generated >= work.max_tokens or len(work.seq.tokens) >= self.context_length:
                reason = FinishReason.LENGTH
        if reason is not None and not work.stops.stopped:
            text += work.stops.push(work.decoder.flush())
            text += work.stops.flush()
        events: list[GenerationEvent] = []
        if text:
            events.append(TokenEvent(text, tuple(work.pending_ids)))
            work.pending_ids.clear()
        if reason is not None:
            seq = work.seq
            usage = Usage(seq.prompt_len, work.generated, seq.cached_tokens or 0)
            events.append(FinishEvent(reason, usage))
            self._retire(work)
        return events

    def _retire(self, work: _Work) -> None:
        del self._work[work.seq.seq_id]
        self._scheduler.finish(work.seq)

    def _fail(self, works: list[_Work], what: str) -> None:
        error_id = uuid.uuid4().hex[:12]
        ids = [work.stream.request_id for work in works[:32]]
        log.exception(what, extra={"error_id": error_id, "request_ids": ids})
        error = BatchFailed(f"generation failed (error id {error_id})", error_id=error_id)
        for work in works:
            self._retire(work)
            self._outbox.append((work.stream, [ErrorEvent(error)]))

    def _publish(self) -> None:
        self._stats = stats = self._snapshot()
        metrics = self._metrics
        metrics.kv_cache_usage.set(stats.kv_usage_ratio)
        metrics.running.set(stats.running)
        metrics.waiting.set(stats.waiting)
        seen = (stats.preemptions, stats.prefix_cache_hit_tokens, stats.prefix_cache_query_tokens)
        counters = (metrics.preemptions, metrics.prefix_cache_hits, metrics.prefix_cache_queries)
        for counter, now, before in zip(counters, seen, self._seen, strict=True):
            if now > before:
                counter.inc(now - before)
        self._seen = seen

    def _snapshot(self) -> EngineStats:
        pool, scheduler = self._pool, self._scheduler
        return EngineStats(
            running=scheduler.num_running,
            waiting=scheduler.num_waiting + len(self._inbox),
            kv_usage_ratio=pool.usage_ratio,
            num_blocks=pool.num_blocks,
            free_blocks=pool.free_blocks,
            cached_blocks=pool.cached_blocks,
            block_size=pool.block_size,
            preemptions=scheduler.preemptions,
            prefix_cache_hit_tokens=pool.hit_tokens,
            prefix_cache_query_tokens=pool.query_tokens,
            steps=self._steps,
        )


def _longest_token_bytes(codec: TextCodec, vocab_size: int) -> int:
    """Most UTF-8 bytes of prompt text one token can stand for, so more cannot fit.

    Each vocabulary entry is decoded alone. That shows a partial UTF-8 sequence as U+FFFD
    (3 bytes, more than it stands for) and may drop SentencePiece's leading space, hence one
    byte more; control tokens decode to nothing, and every one of them a chat template adds
    stands for at least `_CONTROL_TOKEN_BYTES`. Sound for the byte-level and byte-fallback
    BPE tokenizers served here, which never shrink text while normalising it.
    """
    longest = max(len(codec.decode([token]).encode("utf-8")) for token in range(vocab_size))
    return max(longest + 1, _CONTROL_TOKEN_BYTES)


def _post(stream: GenerationStream, events: list[GenerationEvent]) -> None:
    """Hand `events` to `stream` on its event loop, from any thread."""
    try:
        stream._loop.call_soon_threadsafe(stream._push, events)
    except RuntimeError:
        # Its loop is closed: nobody is left to read the stream.
        return


def _deliver(deliveries: list[tuple[GenerationStream, list[GenerationEvent]]]) -> None:
    """Post one step's events, one hop per event loop (usually there is one)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[GenerationStream, list[GenerationEvent]]]]
    by_loop = {}
    for stream, events in deliveries:
        if events:
            by_loop.setdefault(stream._loop, []).append((stream, events))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_push_all, batch)
        except RuntimeError:
            continue


def _push_all(batch: list[tuple[GenerationStream, list[GenerationEvent]]]) -> None:
    for stream, events in batch:
        stream._push(events)
