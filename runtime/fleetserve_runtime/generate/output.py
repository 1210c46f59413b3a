"""Output processing: one sampled token of a request becomes its stream's events.

Runs on the engine's worker thread, after each step: the token is decoded to text
(incrementally, so a character split over tokens is held back), the stop strings cut it,
and the request finishes at an end-of-sequence token (unless ignored) or one of its
`stop_token_ids` (neither shown in the text), a stop string, the end of its output grammar
(which each token advances: `generate.grammar`),
`max_tokens` or the model's context, with a `FinishEvent` carrying its usage. Latency
metrics (time to first token, between tokens) are observed here, where each token lands.
A token's log-probability entry (when asked) travels with the text delta of its token; the
echoed prompt (`SamplingParams.echo`, `prompt_logprobs`) comes first, and with `max_tokens`
0 it is the whole answer: the token sampled after the prompt is dropped.
A choice of an `n` > 1 request tags its events with its index (its echoed prompt too: each
choice echoes it, as vLLM does) and counts its usage into the request's (`_as_choice`).
"""

from __future__ import annotations

from dataclasses import replace

from fleetserve_runtime.generate.contracts import (
    EchoedPrompt,
    FinishEvent,
    FinishReason,
    GenerationEvent,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from fleetserve_runtime.generate.metrics import VersionGenerationMetrics
from fleetserve_runtime.generate.request import EngineRequest
from fleetserve_runtime.models.causal_lm import TextCodec

__all__ = ["OutputProcessor"]


class OutputProcessor:
    """Turns sampled tokens into text deltas and finish events for one model."""

    def __init__(
        self,
        *,
        codec: TextCodec,
        context_length: int,
        metrics: VersionGenerationMetrics,
    ) -> None:
        self._codec = codec
        self._context_length = context_length
        self._metrics = metrics

    def on_token(
        self,
        request: EngineRequest,
        token: int,
        now: float,
        logprob: TokenLogprob | None = None,
    ) -> tuple[list[GenerationEvent], bool]:
        """Account one new token of `request`: its events, and whether it finished.

        `logprob` is the token's entry when the request asked for log-probabilities.
        """
        events = self._echo(request)
        if request.max_tokens == 0:
            seq = request.seq
            usage = Usage(seq.prompt_len, 0, seq.cached_tokens or 0)
            return _tagged(request, [*events, FinishEvent(FinishReason.LENGTH, usage)]), True
        metrics = self._metrics
        if request.last_token_at is None:
            metrics.time_to_first_token.observe(now - request.seq.arrived_at)
        else:
            metrics.inter_token_latency.observe(now - request.last_token_at)
        request.last_token_at = now
        request.generated += 1
        reason: FinishReason | None = None
        text = ""
        if logprob is not None:
            request.pending_logprobs.append(logprob)
        grammar_ended = _advance_grammar(request, token)
        if (
            token in self._codec.eos_token_ids and not request.params.ignore_eos
        ) or token in request.params.stop_token_ids:
            reason = FinishReason.STOP
        else:
            request.pending_ids.append(token)
            text = request.stops.push(request.decoder.push(token))
            if request.stops.stopped or grammar_ended:
                reason = FinishReason.STOP
            elif (
                request.generated >= request.max_tokens
                or len(request.seq.tokens) >= self._context_length
            ):
                reason = FinishReason.LENGTH
        if reason is not None and not request.stops.stopped:
            text += request.stops.push(request.decoder.flush())
            text += request.stops.flush()
        if text or (reason is not None and request.pending_logprobs):
            pending = tuple(request.pending_logprobs)
            events.append(TokenEvent(text, tuple(request.pending_ids), pending))
            request.pending_ids.clear()
            request.pending_logprobs.clear()
        if reason is not None:
            seq = request.seq
            usage = Usage(seq.prompt_len, request.generated, seq.cached_tokens or 0)
            events.append(FinishEvent(reason, usage))
        return _tagged(request, events), reason is not None

    def _echo(self, request: EngineRequest) -> list[GenerationEvent]:
        """The echoed prompt, once, before the first output: when asked, else nothing."""
        params = request.params
        if request.prompt_sent or not (params.echo or params.prompt_logprobs is not None):
            return []
        request.prompt_sent = True
        seq = request.seq
        ids = tuple(seq.tokens[: seq.prompt_len])
        logprobs = request.prompt_logprobs
        prompt = EchoedPrompt(
            text=self._codec.decode(ids),
            token_ids=ids,
            logprobs=None if logprobs is None else tuple(logprobs),
            first_token=self._codec.decode(ids[:1]),
        )
        return [TokenEvent("", prompt=prompt)]


def _advance_grammar(request: EngineRequest, token: int) -> bool:
    """Move the request's output grammar (if any) past `token`; whether the grammar ended."""
    grammar = request.sampling.grammar
    if grammar is None:
        return False
    grammar.advance(token)
    return grammar.ended


def _tagged(request: EngineRequest, events: list[GenerationEvent]) -> list[GenerationEvent]:
    """`events` as they go out: those of a choice of an `n` > 1 request via `_as_choice`."""
    return events if request.choices is None else _as_choice(request, events)


def _as_choice(request: EngineRequest, events: list[GenerationEvent]) -> list[GenerationEvent]:
    """The events of one choice of an `n` > 1 request: its index, and the usage of all.

    The prompt counts once (with the first choice's cached tokens); each finish adds its
    completion tokens, and the last one is `final`.
    """
    choices = request.choices
    assert choices is not None
    tagged: list[GenerationEvent] = []
    for event in events:
        if isinstance(event, TokenEvent):
            tagged.append(replace(event, index=request.index))
        elif isinstance(event, FinishEvent):
            choices.remaining -= 1
            choices.completion_tokens += event.usage.completion_tokens
            first = choices.members[0].seq
            usage = Usage(first.prompt_len, choices.completion_tokens, first.cached_tokens or 0)
            final = choices.remaining == 0
            tagged.append(replace(event, usage=usage, index=request.index, final=final))
        else:
            tagged.append(event)
    return tagged
