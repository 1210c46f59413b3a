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

__all__ = ["EngineRequest"]


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
    the first token; complete when it holds one per prompt token."""
    prompt_sent: bool = False
    """The echoed prompt went out (`params.echo` or `prompt_logprobs`: the first event)."""

    @property
    def seq_id(self) -> int:
        """Its sequence's id, the key the engine core finds it by."""
        return self.seq.seq_id
