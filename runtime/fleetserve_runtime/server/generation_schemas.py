"""What every generation API shares: sampling fields and their bounds, controls, usage.

The generation bodies (`openai_requests` for OpenAI's API, `oip_generate_schemas` for the
OIP generate extension) are pydantic models over `SamplingFields`, whose ranges
(`temperature` in [0, 2], `top_p` in (0, 1], at most four `stop` strings, the penalties,
`logit_bias`, `min_p`, `min_tokens`, `stop_token_ids`) `decode_body`
checks, refusing a bad body with a 400 naming the field before anything is tokenised.
`sampling_params` turns them into the engine's `SamplingParams` under the server's limits
(`generation.max_output_tokens`, `generation.allow_ignore_eos`); `usage_body` is the token
counts as every answer reports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, TypedDict

from pydantic import AfterValidator, BaseModel, Field

from fleetserve_runtime.core.config_sections import GenerationConfig
from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.generate.contracts import SamplingParams, Usage

__all__ = [
    "MAX_LOGIT_BIAS",
    "MAX_STOPS",
    "MAX_STOP_TOKEN_IDS",
    "MAX_STOP_CHARS",
    "MaxTokens",
    "RequestControls",
    "SamplingFields",
    "TokenId",
    "UsageBody",
    "sampling_params",
    "usage_body",
]

MAX_STOPS = 4
"""Most stop strings, as OpenAI allows."""
MAX_STOP_CHARS = 256
"""Longest stop string, in characters."""


def _check_stops(value: str | list[str]) -> str | list[str]:
    stops = [value] if isinstance(value, str) else value
    if len(stops) > MAX_STOPS:
        msg = f"at most {MAX_STOPS} stop strings are allowed, got {len(stops)}"
        raise ValueError(msg)
    for stop in stops:
        if not 0 < len(stop) <= MAX_STOP_CHARS:
            msg = f"stop strings must have 1 to {MAX_STOP_CHARS} characters, got {len(stop)}"
            raise ValueError(msg)
    return value


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=-1)]
"""0 or -1 (vLLM's spelling): no top-k cut."""
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
MaxTokens = Annotated[int, Field(ge=1)]
Stop = Annotated[str | list[str], AfterValidator(_check_stops)]
TokenId = Annotated[int, Field(ge=0, strict=True)]
"""Strict: `true` or `1.0` is no token id (lax parsing would read them as 1)."""


MAX_LOGIT_BIAS = 300
"""Most entries of `logit_bias`, as OpenAI allows."""
MAX_STOP_TOKEN_IDS = 64
"""Most `stop_token_ids`."""


def _check_logit_bias(value: dict[str, float]) -> dict[str, float]:
    if len(value) > MAX_LOGIT_BIAS:
        msg = f"at most {MAX_LOGIT_BIAS} logit_bias entries are allowed, got {len(value)}"
        raise ValueError(msg)
    for key in value:
        if not (key.isascii() and key.isdigit() and len(key) <= 12):
            msg = f"logit_bias keys must be token ids, got {key[:40]!r}"
            raise ValueError(msg)
    return value


Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
"""OpenAI's presence and frequency penalties."""
RepetitionPenalty = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
MinP = Annotated[float, Field(ge=0.0, le=1.0)]
LogitBias = Annotated[
    dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]], AfterValidator(_check_logit_bias)
]
"""Token id (as a string, OpenAI's spelling) to a bias added to its logit."""


class SamplingFields(BaseModel):
    """How to decode, as every generation API spells it; None takes OpenAI's default."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    ignore_eos: bool = False
    """Not OpenAI's (vLLM's extension): generate exactly `max_tokens`, as benchmarks do."""
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    repetition_penalty: RepetitionPenalty | None = None
    """vLLM's extension, as are `min_p`, `min_tokens` and `stop_token_ids`."""
    min_p: MinP | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None


@dataclass(frozen=True, slots=True)
class RequestControls:
    """Scheduling the caller asked for (priority, timeout) and the request's id."""

    priority: Priority = Priority.NORMAL
    timeout_s: float | None = None
    request_id: str | None = None


def sampling_params(
    fields: SamplingFields,
    *,
    max_tokens: int | None,
    limits: GenerationConfig,
    prefix: str = "",
    max_tokens_field: str = "max_tokens",
) -> SamplingParams:
    """The engine's `SamplingParams`; OpenAI's defaults (temperature 1, top-p 1).

    An unset `max_tokens` stays unset: the engine, which knows the prompt's length, takes
    `generation.default_max_tokens` or what the context leaves, whichever is less. A larger
    `max_tokens` than `limits` allow, or `ignore_eos` where it is off, is an `InvalidInput`
    naming the field (`prefix` + its name) and the setting.
    """
    if max_tokens is not None and max_tokens > limits.max_output_tokens:
        msg = (
            f"{prefix}{max_tokens_field} {max_tokens} is over this server's limit of "
            f"{limits.max_output_tokens} output tokens (generation.max_output_tokens)"
        )
        raise InvalidInput(msg, param=prefix + max_tokens_field)
    if fields.ignore_eos and not limits.allow_ignore_eos:
        msg = f"{prefix}ignore_eos is not allowed on this server (generation.allow_ignore_eos)"
        raise InvalidInput(msg, param=prefix + "ignore_eos")
    min_tokens = fields.min_tokens or 0
    if min_tokens > (limits.max_output_tokens if max_tokens is None else max_tokens):
        bound = "max_tokens" if max_tokens is not None else "generation.max_output_tokens"
        msg = f"{prefix}min_tokens {min_tokens} is over {bound}"
        raise InvalidInput(msg, param=prefix + "min_tokens")
    stops = [fields.stop] if isinstance(fields.stop, str) else fields.stop or []
    bias = fields.logit_bias or {}
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if fields.temperature is None else fields.temperature,
        top_p=1.0 if fields.top_p is None else fields.top_p,
        top_k=max(fields.top_k or 0, 0),
        seed=fields.seed,
        stop=tuple(stops),
        ignore_eos=fields.ignore_eos,
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        repetition_penalty=fields.repetition_penalty or 1.0,
        logit_bias=tuple((int(token), value) for token, value in bias.items() if value),
        min_p=fields.min_p or 0.0,
        min_tokens=min_tokens,
        stop_token_ids=tuple(fields.stop_token_ids or ()),
    )


class PromptTokensDetails(TypedDict):
    """Prompt tokens served from the prefix cache."""

    cached_tokens: int


class UsageBody(TypedDict):
    """`usage` of a response or of a stream's last chunk."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def usage_body(usage: Usage) -> UsageBody:
    """OpenAI's `usage` of the engine's counts."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
