"""The engine core: the worker thread's loop of steps (schedule, run the model, process outputs).

The event loop hands it new and cancelled requests (`add`, `cancel`, thread-safe); the
worker takes them in at a step boundary, lets the `Scheduler` plan a step, runs
`CausalLM.forward` on it, samples the sequences whose chunk reached their end, lets the
`OutputProcessor` turn each new token into events, retires finished sequences at once (the
other choices of an `n` > 1 request join once its first has sampled, `_release_choices`), and
posts each step's events to the event loop in one hop. A model step that raises fails the
sequences of that step, not the engine; output processing that raises for one sequence
fails that sequence alone.

Log-probabilities (`logprobs`) are computed here, batched over the rows that asked: the
sampled tokens' from the raw logits before `sample` sees them, and a prompt's from the
all-position logits its prefill chunks return (`SeqChunk.all_logits`) while it wants them.

Liveness watches the worker through `running_step`: the step in progress (from taking new
work in to posting its events) with the time it should take from the pace of recent steps.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fleetserve_runtime.core.errors import BatchFailed, FleetserveError
from fleetserve_runtime.core.liveness import RunningBatch
from fleetserve_runtime.generate.blocks import BlockPool
from fleetserve_runtime.generate.contracts import ErrorEvent, TokenLogprob
from fleetserve_runtime.generate.limits import EngineLimits
from fleetserve_runtime.generate.logprobs import prompt_targets, token_logprobs
from fleetserve_runtime.generate.metrics import VersionGenerationMetrics
from fleetserve_runtime.generate.output import OutputProcessor
from fleetserve_runtime.generate.request import EngineRequest
from fleetserve_runtime.generate.sampling import sample
from fleetserve_runtime.generate.scheduler import Scheduler, SchedulerLimits, StepPlan
from fleetserve_runtime.generate.stream import Delivery, deliver
from fleetserve_runtime.models.causal_lm import CausalLM, SeqChunk, StepInput, TextCodec

__all__ = ["IDLE_POLL_S", "EngineCore", "EngineStats", "StepPace"]

log = logging.getLogger("fleetserve.generate")

IDLE_POLL_S = 0.05
"""How long the worker sleeps when sequences wait but none can be scheduled (never expected:
`submit` refuses what cannot fit alone); it keeps such a bug from spinning a core."""


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
    prefix_cache_resumed_hit_tokens: int
    prefix_cache_resumed_query_tokens: int
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


class EngineCore:
    """The scheduler, the model and the requests in flight of one engine; see the module."""

    def __init__(
        self,
        *,
        lm: CausalLM,
        codec: TextCodec,
        limits: EngineLimits,
        metrics: VersionGenerationMetrics,
        context_length: int,
        clock: Callable[[], float],
    ) -> None:
        self._lm = lm
        self._codec = codec
        self._clock = clock
        self._metrics = metrics
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
        self._output = OutputProcessor(codec=codec, context_length=context_length, metrics=metrics)
        self._wake = threading.Condition()
        self._inbox: list[EngineRequest] = []
        self._cancelled: list[EngineRequest] = []
        self._stopping = False
        self._requests: dict[int, EngineRequest] = {}
        """Requests the worker owns, by sequence id (the worker's alone while it runs)."""
        self._outbox: list[Delivery] = []
        """Events of the current step, posted to the event loop once it is accounted."""
        self._steps = 0
        self._pace = StepPace()
        self._running: RunningBatch | None = None
        """The step in progress (start on the `perf_counter` clock); None while idle."""
        self._seen = (0, 0, 0, 0, 0)
        """Preemptions, prefix hit and query tokens already counted into the metrics."""
        self._stats = self._snapshot()

    # -- the event loop's side ---------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission, those not yet taken in by the worker included."""
        return self._scheduler.num_waiting + len(self._inbox)

    @property
    def stopping(self) -> bool:
        """True once `request_stop` was called."""
        return self._stopping

    @property
    def running_step(self) -> RunningBatch | None:
        """The step in progress; None while the worker is idle."""
        return self._running

    def stats(self) -> EngineStats:
        """The state after the last step."""
        return self._stats

    def add(self, request: EngineRequest) -> None:
        """Hand a new request to the worker (from any thread)."""
        with self._wake:
            self._inbox.append(request)
            self._wake.notify()

    def cancel(self, request: EngineRequest) -> None:
        """The worker drops `request` at its next step boundary (from any thread)."""
        with self._wake:
            self._cancelled.append(request)
            self._wake.notify()

    def request_stop(self) -> None:
        """Make `run` return after its current step."""
        with self._wake:
            self._stopping = True
            self._wake.notify_all()

    def abort_all(self, error: FleetserveError) -> None:
        """Fail every waiting and running request; only once the worker has ended."""
        for request in self._requests.values():
            self._scheduler.finish(request.seq)
        pending = [*self._requests.values(), *self._inbox]
        self._requests.clear()
        self._inbox.clear()
        for request in pending:
            request.stream.post([ErrorEvent(error)])
        self._stats = self._snapshot()

    # -- the worker thread -------------------------------------------------------------

    def run(self) -> None:
        """Step until `request_stop`; the worker thread's target."""
        while True:
            with self._wake:
                while not (self._stopping or self._inbox or self._cancelled or self._requests):
                    self._wake.wait()
                if self._stopping:
                    return
                inbox, self._inbox = self._inbox, []
                cancelled, self._cancelled = self._cancelled, []
            started = time.perf_counter()
            self._running = RunningBatch(started, self._pace.expected_s(0))
            self._take_in(inbox, cancelled)
            try:
                tokens = self._step(started)
            except Exception:
                self._fail(list(self._requests.values()), "engine step failed")
                tokens = None
            # Stats first: a caller that got its last event sees the blocks already freed.
            self._publish()
            outbox, self._outbox = self._outbox, []
            deliver(outbox)
            self._running = None
            if tokens:
                self._pace.update(time.perf_counter() - started, tokens)
            elif tokens == 0:
                with self._wake:
                    self._wake.wait(IDLE_POLL_S)

    def _take_in(self, inbox: list[EngineRequest], cancelled: list[EngineRequest]) -> None:
        """New requests join the scheduler; cancelled ones (all their choices) leave it."""
        for request in inbox:
            self._requests[request.seq_id] = request
            self._scheduler.add(request.seq)
        for request in cancelled:
            for member in _family(request):
                if self._requests.pop(member.seq_id, None) is not None:
                    self._scheduler.finish(member.seq)
            if request.choices is not None:
                request.choices.pending.clear()

    def _step(self, started: float) -> int | None:
        """Plan and run one step; the tokens it computed (0: nothing to run, None: it failed)."""
        plan = self._scheduler.schedule()
        for seq in plan.admitted:
            request = self._requests[seq.seq_id]
            if not request.counted:
                request.counted = True
                self._metrics.prompt_tokens.inc(seq.prompt_len)
        if not plan.chunks:
            return 0
        scheduled = sum(len(chunk.token_ids) for chunk in plan.chunks)
        self._running = RunningBatch(started, self._pace.expected_s(scheduled))
        step = StepInput(
            [
                SeqChunk(c.token_ids, c.start, c.seq.block_table, all_logits=c.seq.prompt_logits)
                for c in plan.chunks
            ]
        )
        try:
            tokens, logprobs = self._forward(plan, step)
        except Exception:
            stepped = [self._requests[chunk.seq.seq_id] for chunk in plan.chunks]
            self._fail(stepped, "model step failed")
            return None
        self._scheduler.commit(plan, tokens)
        self._steps += 1
        now = self._clock()
        generated = 0
        for chunk, token, logprob in zip(plan.chunks, tokens, logprobs, strict=True):
            if token is None:
                continue
            request = self._requests[chunk.seq.seq_id]
            # A prompt-only request (`max_tokens` 0) drops what its last prefill sampled.
            generated += 1 if request.max_tokens else 0
            self._release_choices(request)
            try:
                events, finished = self._output.on_token(request, token, now, logprob)
                if finished:
                    self._retire(request)
            except Exception:
                # Decoding or matching stops failed for this sequence's text alone: the
                # others of the step (and those waiting) keep going.
                self._fail([request], "decoding a generated token failed")
                continue
            self._outbox.append((request.stream, events))
        self._metrics.generation_tokens.inc(generated)
        return scheduled

    def _forward(
        self, plan: StepPlan, step: StepInput
    ) -> tuple[list[int | None], list[TokenLogprob | None]]:
        """Run the model and sample: per chunk, its new token and (if asked) its logprob."""
        logits = self._lm.forward(step)
        if any(chunk.all_logits for chunk in step.chunks):
            logits = self._take_prompt_logprobs(plan, step, logits)
        rows = [n for n, chunk in enumerate(plan.chunks) if chunk.samples]
        tokens: list[int | None] = [None] * len(plan.chunks)
        logprobs: list[TokenLogprob | None] = [None] * len(plan.chunks)
        if not rows:
            return tokens, logprobs
        picked = logits if len(rows) == len(plan.chunks) else logits[rows]
        requests = [self._requests[plan.chunks[n].seq.seq_id] for n in rows]
        asked = [i for i, request in enumerate(requests) if request.params.logprobs is not None]
        # A copy of the raw rows, taken before `sample` adjusts (penalties, logit_bias, ...)
        # or scales them: the entries describe the model's distribution, not the sampler's.
        raw = picked[asked] if asked else None
        sampled = sample(
            picked,
            [request.sampling for request in requests],
            [request.seq for request in requests],
        )
        if raw is not None:
            entries = token_logprobs(
                raw,
                [sampled[i] for i in asked],
                [requests[i].params.logprobs or 0 for i in asked],
                self._token_text,
            )
            for i, entry in zip(asked, entries, strict=True):
                logprobs[rows[i]] = entry
        for n, token in zip(rows, sampled, strict=True):
            tokens[n] = token
        return tokens, logprobs

    def _take_prompt_logprobs(
        self, plan: StepPlan, step: StepInput, logits: torch.Tensor
    ) -> torch.Tensor:
        """Record the prompt log-probabilities of the `all_logits` chunks; each chunk's last row.

        A position already recorded (computed again after a preemption) is skipped; once a
        sequence has one entry per prompt token, it wants no more rows and may reuse the
        prefix cache again.
        """
        last: list[int] = []
        rows: list[int] = []
        targets: list[int] = []
        widths: list[int] = []
        owners: list[tuple[EngineRequest, int, int]] = []
        row = 0
        for chunk, piece in zip(plan.chunks, step.chunks, strict=True):
            if piece.all_logits:
                seq = chunk.seq
                request = self._requests[seq.seq_id]
                wanted = prompt_targets(seq.tokens, seq.prompt_len, chunk.start, chunk.length)
                rows.extend(range(row, row + len(wanted)))
                targets.extend(wanted)
                widths.extend([request.params.prompt_logprobs or 0] * len(wanted))
                owners.append((request, chunk.start + 1, len(wanted)))
            row += len(piece.token_ids) if piece.all_logits else 1
            last.append(row - 1)
        entries = token_logprobs(logits[rows], targets, widths, self._token_text)
        for request, first, count in owners:
            mine, entries = entries[:count], entries[count:]
            collected = request.prompt_logprobs
            if collected is None:
                continue
            for position, entry in enumerate(mine, start=first):
                if position == len(collected):
                    collected.append(entry)
            if len(collected) >= request.seq.prompt_len:
                request.seq.prompt_logits = False
        return logits[last]

    def _token_text(self, token_id: int) -> str:
        return self._codec.decode([token_id])

    def _release_choices(self, request: EngineRequest) -> None:
        """Schedule the other choices of an `n` > 1 request once its first one sampled.

        Its prompt's full blocks are computed and in the prefix cache by now (`commit`), so
        they take references to them rather than computing the prompt again; its prompt
        log-probabilities (when asked) are complete too, and they echo the same ones.
        """
        choices = request.choices
        if choices is None or not choices.pending:
            return
        for child in choices.pending:
            child.prompt_logprobs = request.prompt_logprobs
            self._requests[child.seq_id] = child
            self._scheduler.add(child.seq)
        choices.pending.clear()

    def _retire(self, request: EngineRequest) -> None:
        del self._requests[request.seq_id]
        self._scheduler.finish(request.seq)

    def _fail(self, requests: list[EngineRequest], what: str) -> None:
        error_id = uuid.uuid4().hex[:12]
        ids = [request.stream.request_id for request in requests[:32]]
        log.exception(what, extra={"error_id": error_id, "request_ids": ids})
        error = BatchFailed(f"generation failed (error id {error_id})", error_id=error_id)
        failed: dict[int, EngineRequest] = {}
        for request in requests:
            # The choices of an `n` > 1 request share its stream, which the error ends.
            for member in _family(request):
                if self._requests.get(member.seq_id) is member:
                    self._retire(member)
            if request.choices is not None:
                request.choices.pending.clear()
            failed.setdefault(id(request.stream), request)
        for request in failed.values():
            self._outbox.append((request.stream, [ErrorEvent(error)]))

    def _publish(self) -> None:
        self._stats = stats = self._snapshot()
        metrics = self._metrics
        metrics.kv_cache_usage.set(stats.kv_usage_ratio)
        metrics.running.set(stats.running)
        metrics.waiting.set(stats.waiting)
        seen = (
            stats.preemptions,
            stats.prefix_cache_hit_tokens,
            stats.prefix_cache_query_tokens,
            stats.prefix_cache_resumed_hit_tokens,
            stats.prefix_cache_resumed_query_tokens,
        )
        counters = (
            metrics.preemptions,
            metrics.prefix_cache_hits,
            metrics.prefix_cache_queries,
            metrics.prefix_cache_resumed_hits,
            metrics.prefix_cache_resumed_queries,
        )
        for counter, now, before in zip(counters, seen, self._seen, strict=True):
            if now > before:
                counter.inc(now - before)
        self._seen = seen

    def _snapshot(self) -> EngineStats:
        pool, scheduler = self._pool, self._scheduler
        return EngineStats(
            running=scheduler.num_running,
            waiting=self.num_waiting,
            kv_usage_ratio=pool.usage_ratio,
            num_blocks=pool.num_blocks,
            free_blocks=pool.free_blocks,
            cached_blocks=pool.cached_blocks,
            block_size=pool.block_size,
            preemptions=scheduler.preemptions,
            prefix_cache_hit_tokens=pool.hit_tokens,
            prefix_cache_query_tokens=pool.query_tokens,
            prefix_cache_resumed_hit_tokens=pool.resumed_hit_tokens,
            prefix_cache_resumed_query_tokens=pool.resumed_query_tokens,
            steps=self._steps,
        )


def _family(request: EngineRequest) -> list[EngineRequest]:
    """Every sequence of `request`'s request: its choices when `n` > 1, else itself."""
    return request.choices.members if request.choices is not None else [request]
