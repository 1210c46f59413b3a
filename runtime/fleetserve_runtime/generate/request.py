"""What the engine keeps of one request while it generates, beside the scheduler's `Seq`.

The worker thread alone touches it once it is submitted: the output processor (`output`)
advances its text state with every token, the engine core retires it. The stream it feeds
lives on the event loop and is reached only through its thread-safe methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetserve_runtime.generate.contracts import SamplingParams, TokenLogprob
from fleetserve_runtime.generate.sampling import RowSampling
from fleetserve_runtime.generate.sequence import Seq
from fleetserve_runtime.generate.stops import StopMatcher
from fleetserve_runtime.generate.stream import GenerationStream
from fleetserve_runtime.models.causal_lm import IncrementalDecoder

__all__ = ["Choices", "EngineRequest"]


@dataclass(slots=True, eq=False)
class Choices:
    """The sequences of one `n` > 1 request, which share its stream.

    Only the first is scheduled at once; the others wait in `pending` until its prompt is
    computed, so that they find the prompt's full blocks in the prefix cache instead of
    computing them again. Their events carry their `index`; the last one to finish sends
    the `final` finish with the usage of all (the prompt counted once).
    """

    members: list[EngineRequest] = field(default_factory=list)
    pending: list[EngineRequest] = field(default_factory=list)
    remaining: int = 0
    completion_tokens: int = 0


@dataclass(slots=True, eq=False)
class EngineRequest:
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
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    """With `params.logprobs`: the entries of the tokens not yet sent (`pending_ids`, and a
    final end-of-sequence token)."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """With `params.prompt_logprobs`: the prompt tokens' entries computed so far, None for
    the first token; complete when it holds one per prompt token. Of an `n` > 1 request's
    choices only the first computes them; the others get its complete list when they join
    (`EngineCore._release_choices`)."""
    prompt_sent: bool = False
    """The echoed prompt went out (`params.echo` or `prompt_logprobs`: the first event)."""
    index: int = 0
    """Its choice's index within its request (0 unless `n` > 1)."""
    choices: Choices | None = None
    """The request's other sequences when `n` > 1; None otherwise."""

    @property
    def seq_id(self) -> int:
        """Its sequence's id, the key the engine core finds it by."""
        return self.seq.seq_id
