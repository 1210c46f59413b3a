"""The shapes that pass between the generative engine and its callers.

The edge builds a `GenerationRequest` (a prompt, `SamplingParams`, priority and deadline);
the engine streams `GenerationEvent`s back (`TokenEvent`s, then a `FinishEvent` with the
`Usage`, or an `ErrorEvent`). What the engine steps (a `CausalLM` and its `TextCodec`) is the
models' side, in `models.causal_lm`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.models.causal_lm import ChatMessage

__all__ = [
    "EchoedPrompt",
    "ErrorEvent",
    "FinishEvent",
    "FinishReason",
    "GenerationEvent",
    "GenerationRequest",
    "GrammarKind",
    "OutputGrammar",
    "SamplingParams",
    "TokenEvent",
    "TokenLogprob",
    "Usage",
    "is_greedy",
]


def is_greedy(temperature: float) -> bool:
    """Whether decoding at `temperature` is greedy (always the most likely token)."""
    return temperature <= 0.0


class GrammarKind(StrEnum):
    """How `OutputGrammar.text` states the language of the output."""

    JSON_SCHEMA = "json_schema"
    """A JSON schema, as JSON text: the output is one JSON value it validates."""
    LARK = "lark"
    """A Lark grammar over the output text (llguidance's dialect)."""


@dataclass(frozen=True, slots=True)
class OutputGrammar:
    """A language the output must belong to, enforced as a token mask while sampling.

    Every sampled token keeps the text a prefix of a sentence of the language, and the
    sequence ends where the language does (`generate.grammar`).
    """

    kind: GrammarKind
    text: str
    field: str = "response_format"
    """The request field it came from, which a refusal of it names."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request decoding; the API validates the ranges before building one."""

    max_tokens: int | None
    """None: the engine's default (`EngineLimits.default_max_tokens`), at most the room the
    context (or the KV pool, if smaller) leaves."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 means no top-k cut."""
    seed: int | None = None
    """With temperature > 0, the same seed and prompt give the same output."""
    stop: tuple[str, ...] = ()
    """Strings that end the output; they are cut from the text."""
    ignore_eos: bool = False
    """Keep generating past end-of-sequence tokens (benchmarks ask for exact lengths)."""
    logprobs: int | None = None
    """Report each generated token's log-probability with this many most likely
    alternatives (`TokenEvent.logprobs`); None reports none."""
    prompt_logprobs: int | None = None
    """Report each prompt token's log-probability with this many alternatives
    (`EchoedPrompt.logprobs`); None computes none. A request asking for them skips the
    prefix cache: reused blocks would skip the positions whose logits are needed."""
    echo: bool = False
    """The first event carries the prompt (`TokenEvent.prompt`); with it, `max_tokens` may
    be 0: the prompt (and its log-probabilities) alone, nothing generated."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token generated so far (OpenAI's, -2..2)."""
    frequency_penalty: float = 0.0
    """Subtracted once per time a token was generated so far (OpenAI's, -2..2)."""
    repetition_penalty: float = 1.0
    """vLLM's: logits of tokens in the prompt or generated so far are divided by it when
    positive and multiplied by it when negative; 1 leaves them."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to those tokens' logits (OpenAI's, -100..100)."""
    min_p: float = 0.0
    """vLLM's: drop tokens less likely than `min_p` times the most likely one; 0 is off."""
    min_tokens: int = 0
    """vLLM's: end-of-sequence and `stop_token_ids` cannot be sampled before this many."""
    stop_token_ids: tuple[int, ...] = ()
    """vLLM's: token ids that end the output like end-of-sequence (not shown in the text)."""
    grammar: OutputGrammar | None = None
    """The output is held to this language (structured output); None leaves it free."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation: a prompt (text, chat messages or token ids) and how to decode it."""

    sampling: SamplingParams
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    priority: Priority = Priority.NORMAL
    timeout_s: float | None = None
    """Total time allowed (queue and generation); None takes the configured default."""
    version: str | None = None
    request_id: str | None = None
    n: int = 1
    """Choices to generate for the one prompt (OpenAI's `n`): sequences that share the
    prompt's KV blocks through the prefix cache, their events told apart by `index`."""
    cache_salt: str | None = None
    """Prefix-cache isolation: cached KV blocks are shared only between requests with the
    same salt (None is a salt of its own), so a caller cannot learn from `cached_tokens`
    whether another party sent a prompt."""


class FinishReason(StrEnum):
    """Why a sequence ended, in the OpenAI API's words."""

    STOP = "stop"
    """An end-of-sequence token or a stop string."""
    LENGTH = "length"
    """`max_tokens`, or the model's context, was reached."""
    TOOL_CALLS = "tool_calls"
    """The answer is a call of the request's tools (set by the edge that parsed it)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    """Prompt tokens whose KV blocks came from the prefix cache."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's log-probability under the model's raw distribution, and the top ones.

    Raw: the log-softmax of the logits before temperature, penalties, top-k or top-p (what
    vLLM reports by default), so the numbers describe the model, not the sampler.
    """

    token_id: int
    token: str
    """The token decoded alone: a special token decodes to "", a token holding part of a
    multi-byte character to U+FFFD, as vLLM shows them."""
    logprob: float
    top: tuple[TokenLogprob, ...] = ()
    """The most likely tokens at that position, most likely first (their own `top` empty)."""


@dataclass(frozen=True, slots=True)
class EchoedPrompt:
    """The prompt as the engine saw it, for `SamplingParams.echo` and `prompt_logprobs`."""

    text: str
    """The prompt's token ids decoded."""
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob | None, ...] | None = None
    """One entry per prompt token, None for the first (nothing precedes it); None unless
    `prompt_logprobs` was asked."""
    first_token: str = ""
    """The first prompt token decoded alone (`TokenLogprob.token`'s spelling), which has
    no entry."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """New output: the text delta (stop strings already cut) and the token ids behind it.

    With `SamplingParams.logprobs`, `logprobs` has one entry per generated token behind the
    delta, as vLLM reports them: a stop string's tokens and a final end-of-sequence token
    included, though their text is not (so the last delta's text may be empty). With
    `echo` or `prompt_logprobs`, each choice's first event carries the `prompt`.
    """

    text: str
    token_ids: tuple[int, ...] = field(default=())
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt: EchoedPrompt | None = None
    index: int = 0
    """Which choice of an `n` > 1 request it belongs to."""


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The end of one choice; the last of them ends a successful generation."""

    reason: FinishReason
    usage: Usage
    """The request's counts so far: the prompt once, the completion tokens of every choice
    that finished (all of them on the `final` event)."""
    index: int = 0
    final: bool = True
    """No choice is left: the generation is over."""


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The generation failed after it started streaming (e.g. its deadline passed)."""

    error: Exception


GenerationEvent = TokenEvent | FinishEvent | ErrorEvent
