"""OpenAI's request bodies: chat and legacy completions, and the generation each asks for.

A body is refused with a 400 (OpenAI's error shape, `param` naming the field) rather than
answered differently from what it asked, in two ways, both in `_refuse_unsupported`:

- Keys no field here reads, at the top level, in `stream_options` or in a message, are named
  (`unsupported parameter: 'guided_json'`), sorted, the first `MAX_NAMED_KEYS` of them. This
  is what OpenAI's API does with a parameter it does not know, and it matters because vLLM's
  and SGLang's extensions (`guided_json`, `chat_template_kwargs`,
  `include_stop_str_in_output`, ...) would change the answer: a server that ignored them
  would answer 200 with text computed differently. (vLLM's `repetition_penalty`, `min_p`,
  `min_tokens` and `stop_token_ids` are implemented: `SamplingFields`.)
- Fields of OpenAI's API this server does not implement (`best_of`, `suffix`, `store`,
  the deprecated `functions` and `function_call`, a `service_tier` or `modalities` that asks
  for something) are refused when set to anything but their no-op value (`_NO_OP`).

Structured output is implemented: chat's `response_format` (`json_object`, or
`json_schema` with `strict` true or false, `openai_structured`) holds the answer to a JSON
value the schema validates, as a token mask in the sampler; a schema over the size bound or
one the grammar compiler cannot enforce is refused naming `response_format`, and
`min_tokens` cannot be combined with it (where the grammar ends only end-of-sequence may
follow).

Log-probabilities are implemented (`generate.logprobs`): chat's `logprobs` and
`top_logprobs` (0..20; `top_logprobs` only with `logprobs: true`, as OpenAI requires), and
completions' `logprobs` (0..5) and `echo` (the prompt, and its log-probabilities with
`logprobs`, before the completion; with `echo`, `max_tokens` may be 0: the prompt alone, what
lm-evaluation-harness scores with). With `n` > 1 each choice carries its own, and each
echoes the prompt (as vLLM does).

Tool calling is implemented (`openai_tools`): function `tools` (another type is refused
naming `tools.<i>.type`), `tool_choice` (`auto`, `none`, `required`, a named function: the
last two held to the call's JSON schema by the output grammar), `parallel_tool_calls`
(false: an answer is one call at most), assistant `tool_calls` and `tool` messages (with
`tool_call_id`) in the history. The tools are written into the system prompt and calls into
the messages as JSON text, in one documented format, since the chat templates here render
role and text only. `logprobs` with active tools, and `response_format` with a required or
named `tool_choice`, are refused naming them.

Accepted without being implemented, because they cannot change the answer: `user` and
`safety_identifier` (an end-user id for the provider's abuse monitoring), chat's `metadata`
(tags for stored completions, which are not kept here), and a message's `name` (not shown
to the model: the chat templates here have no place for it). `messages` are bounded
(`MAX_MESSAGES`). vLLM's `cache_salt` is implemented: it isolates the request's
prefix-cache blocks. `n` (up to `MAX_CHOICES`, and `n` times `max_tokens` within
`generation.max_output_tokens`) is too; `best_of` is refused. A greedy request with `n` > 1
is served, as vLLM serves it: its choices are the same text.
`chat_generation` and `completion_generation` are the pure translation of a validated body
to the engine's `GenerationRequest`. `unknown_keys` and `refuse_unknown` are the unknown-key
check alone, which `embeddings` shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetserve_runtime.core.config_sections import GenerationConfig
from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.generate.contracts import GenerationRequest, OutputGrammar, SamplingParams
from fleetserve_runtime.generate.logprobs import MAX_TOP_LOGPROBS
from fleetserve_runtime.models.causal_lm import ChatMessage
from fleetserve_runtime.server.generation_schemas import (
    MaxTokens,
    RequestControls,
    SamplingFields,
    TokenId,
    sampling_params,
)
from fleetserve_runtime.server.openai_structured import ResponseFormat
from fleetserve_runtime.server.openai_tools import (
    MAX_TOOLS,
    Tool,
    Toolbox,
    ToolCallIn,
    ToolChoice,
    calls_text,
)

__all__ = [
    "MAX_CHOICES",
    "MAX_MESSAGES",
    "MAX_NAMED_KEYS",
    "ChatCompletionRequest",
    "CompletionRequest",
    "StreamOptions",
    "chat_generation",
    "prompt_messages",
    "completion_generation",
    "refuse_unknown",
    "unknown_keys",
]

MAX_MESSAGES = 1024
"""Most messages in one chat request, and content parts in one message."""
MAX_CHOICES = 16
"""Most choices (`n`) one request may ask for."""
MAX_NAMED_KEYS = 8
"""Most unsupported keys one refusal names; the rest are counted."""
_MAX_KEY_CHARS = 64
"""Longest stretch of an unsupported key a refusal repeats (keys are the caller's text)."""

MAX_COMPLETION_LOGPROBS = 5
"""Most alternatives per token a legacy completion may ask for (OpenAI's bound)."""

_EXTRA = ConfigDict(extra="allow")
"""Keys no field reads are kept in `model_extra`, for `_refuse_unsupported` to name."""


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage`; any other key is refused."""

    model_config = _EXTRA

    include_usage: bool = False


class _OpenAIRequest(SamplingFields):
    """Fields chat and legacy completions share."""

    model_config = _EXTRA

    model: str = Field(min_length=1, max_length=256)
    max_tokens: MaxTokens | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    """Accepted, unused: an end-user id for abuse monitoring, which changes no answer."""
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    """vLLM's extension: only requests with the same salt share prefix-cache blocks, so
    `cached_tokens` says nothing of what other parties sent (`GenerationRequest`)."""
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    """Choices for the one prompt; they share its KV blocks (`GenerationRequest.n`)."""


class ChatMessageIn(BaseModel):
    """One message of `messages`; keys other than these are refused."""

    model_config = _EXTRA

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    """A string, or text parts (`[{"type": "text", "text": ...}]`), joined by newlines; null
    only in an assistant message with `tool_calls`."""
    name: str | None = None
    """Accepted, unused: the chat templates here have no place for a participant's name."""
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=MAX_TOOLS)
    """An assistant's calls, shown to the model as it writes them (`openai_tools`)."""
    tool_call_id: str | None = Field(None, min_length=1, max_length=256)
    """A `tool` message's call; required there, refused elsewhere."""

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessageIn:
        if (self.role == "tool") != (self.tool_call_id is not None):
            msg = "tool_call_id is required in a tool message, and only there"
            raise ValueError(msg)
        if self.tool_calls is not None and self.role != "assistant":
            msg = "tool_calls are only allowed in an assistant message"
            raise ValueError(msg)
        if self.content is None and not self.tool_calls:
            msg = "content is required (null only in an assistant message with tool_calls)"
            raise ValueError(msg)
        return self

    def text(self) -> str:
        """What the model is shown: the content, then the calls as it writes them."""
        calls = calls_text(self.tool_calls) if self.tool_calls else ""
        return "\n".join(part for part in (self.content, calls) if part)

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        if not 0 < len(value) <= MAX_MESSAGES:
            msg = f"content must have 1 to {MAX_MESSAGES} parts, got {len(value)}"
            raise ValueError(msg)
        texts: list[str] = []
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            text = part.get("text") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(text, str):
                msg = f"only text content parts are supported, got {str(kind)[:40]!r}"
                raise ValueError(msg)
            texts.append(text)
        return "\n".join(texts)


class ChatCompletionRequest(_OpenAIRequest):
    """`POST /v1/chat/completions` body."""

    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    """Each output token's log-probability (`choices[].logprobs.content`)."""
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    """How many most likely alternatives each entry lists; needs `logprobs: true`."""
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    """Functions the model may call (`openai_tools`)."""
    tool_choice: ToolChoice | None = None
    """`auto` (the default), `none`, `required`, or the function to call."""
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: ResponseFormat | None = None
    """JSON mode or a JSON schema, enforced as a token mask (`openai_structured`)."""
    store: bool | None = None
    service_tier: str | None = None
    modalities: list[str] | None = None
    metadata: dict[str, str] | None = None
    """Accepted, unused: tags for stored completions, and nothing is stored here."""
    safety_identifier: str | None = None
    """Accepted, unused: `user`'s successor, for abuse monitoring."""
    parallel_tool_calls: bool | None = None
    """Whether an answer may make several calls (a JSON array of them); true by default."""

    def toolbox(self) -> Toolbox:
        """The request's tools and how its answers are read."""
        return Toolbox(
            self.tools or (), self.tool_choice, parallel=self.parallel_tool_calls is not False
        )


class CompletionRequest(_OpenAIRequest):
    """`POST /v1/completions` body; `max_tokens` defaults to 16, as OpenAI's does."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    """0 only with `echo`: the prompt (and its log-probabilities) alone."""
    logprobs: Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS, strict=True)] | None = None
    """Each token's log-probability with this many alternatives (plus the chosen token)."""
    echo: bool = False
    """The prompt is returned before the completion (with `logprobs`, scored too)."""
    best_of: int | None = None
    suffix: str | None = None


_NO_OP: dict[str, tuple[object, ...]] = {
    "best_of": (None, 1),
    "suffix": (None, ""),
    "functions": (None, []),
    "function_call": (None, "none"),
    "store": (None, False),
    "service_tier": (None, "auto", "default"),
    "modalities": (None, ["text"]),
}
"""OpenAI fields this server does not implement, and the values that ask for nothing."""


def unknown_keys(model: BaseModel | None) -> list[str]:
    """The keys of `model` no field read, sorted, each cut to `_MAX_KEY_CHARS`."""
    if model is None or not model.model_extra:
        return []
    return sorted(key[:_MAX_KEY_CHARS] for key in model.model_extra)


def _refuse_unknown(body: _OpenAIRequest) -> None:
    """Name every key no field reads: the body's, `stream_options`', then each message's.

    `param` is the first one, dotted as pydantic names fields elsewhere (`messages.0.x`).
    """
    unknown = [(key, key) for key in unknown_keys(body)]
    unknown += [
        (f"stream_options.{key}", f"stream_options.{key}")
        for key in unknown_keys(body.stream_options)
    ]
    if isinstance(body, ChatCompletionRequest):
        unknown += [
            (f"messages[{i}].{key}", f"messages.{i}.{key}")
            for i, message in enumerate(body.messages)
            for key in unknown_keys(message)
        ]
    refuse_unknown(unknown)


def refuse_unknown(unknown: Sequence[tuple[str, str]]) -> None:
    """`InvalidInput` naming the keys no field reads, as (shown, `param`) pairs; none: nothing.

    The first `MAX_NAMED_KEYS` are named, the rest counted; `param` is the first one's.
    """
    if not unknown:
        return
    named = ", ".join(repr(name) for name, _ in unknown[:MAX_NAMED_KEYS])
    more = len(unknown) - MAX_NAMED_KEYS
    plural = "s" if len(unknown) > 1 else ""
    tail = f" and {more} more" if more > 0 else ""
    msg = f"unsupported parameter{plural}: {named}{tail}"
    raise InvalidInput(msg, param=unknown[0][1])


def _refuse_unsupported(body: _OpenAIRequest) -> None:
    """`InvalidInput` for keys no field reads, then for a field set to ask what is not done."""
    _refuse_unknown(body)
    for name, no_op in _NO_OP.items():
        if name not in type(body).model_fields:
            continue
        value = getattr(body, name)
        # `1 == True`: a bool is not the no-op value of a numeric field, nor the reverse.
        if not any(
            value == allowed and isinstance(value, bool) == isinstance(allowed, bool)
            for allowed in no_op
        ):
            shown = repr(value)[:60]
            msg = f"{name}={shown} is not supported by this server"
            if name == "best_of":
                msg = f"best_of={shown} is not supported by this server; n is"
            raise InvalidInput(msg, param=name)


def _choices(body: _OpenAIRequest, max_tokens: int | None, limits: GenerationConfig) -> int:
    """`n`, when its choices' output fits `generation.max_output_tokens` together.

    An unset `max_tokens` counts as `generation.default_max_tokens`, what each may run to.
    """
    n = body.n or 1
    each = max_tokens if max_tokens is not None else limits.default_max_tokens
    if n > 1 and n * each > limits.max_output_tokens:
        msg = (
            f"n={n} choices of up to {each} tokens each is over this server's limit of "
            f"{limits.max_output_tokens} output tokens (generation.max_output_tokens)"
        )
        raise InvalidInput(msg, param="n")
    return n


def _check_stream_options(body: _OpenAIRequest) -> None:
    if body.stream_options is not None and not body.stream:
        msg = "stream_options is only allowed when stream is true"
        raise InvalidInput(msg, param="stream_options")


def chat_generation(
    body: ChatCompletionRequest, *, controls: RequestControls, limits: GenerationConfig
) -> GenerationRequest:
    """The generation a chat request asks for; `InvalidInput` (naming the field) if refused."""
    _check_stream_options(body)
    _refuse_unsupported(body)
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        msg = "set max_completion_tokens or max_tokens, not both"
        raise InvalidInput(msg, param="max_completion_tokens")
    toolbox = body.toolbox()
    messages = toolbox.with_tools(prompt_messages(body.messages))
    if body.top_logprobs and not body.logprobs:
        msg = "top_logprobs needs logprobs set to true"
        raise InvalidInput(msg, param="top_logprobs")
    field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    sampling = sampling_params(body, max_tokens=max_tokens, limits=limits, max_tokens_field=field)
    return GenerationRequest(
        sampling=_with_logprobs(
            replace(sampling, grammar=_chat_grammar(body, toolbox)),
            (body.top_logprobs or 0) if body.logprobs else None,
            echo=False,
        ),
        messages=messages,
        n=_choices(body, max_tokens, limits),
        priority=controls.priority,
        timeout_s=controls.timeout_s,
        request_id=controls.request_id,
        cache_salt=body.cache_salt,
    )


def prompt_messages(messages: Sequence[ChatMessageIn]) -> list[ChatMessage]:
    """What the chat template renders: `developer` as `system`, calls written as text."""
    return [
        ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text())
        for m in messages
    ]


def _chat_grammar(body: ChatCompletionRequest, toolbox: Toolbox) -> OutputGrammar | None:
    """The output grammar: `response_format`'s, or a required call's; `InvalidInput`."""
    problem = toolbox.check()
    if problem is not None:
        raise InvalidInput(problem, param="tool_choice")
    if toolbox.active and body.logprobs:
        # A streamed answer that may be a call is held back until it ends: its tokens'
        # entries would have no text to travel with.
        msg = "logprobs cannot be combined with tools (unless tool_choice is 'none')"
        raise InvalidInput(msg, param="logprobs")
    formatted = body.response_format.grammar() if body.response_format is not None else None
    called = toolbox.grammar()
    if formatted is not None and called is not None:
        msg = "response_format cannot be combined with a required or named tool_choice"
        raise InvalidInput(msg, param="response_format")
    return formatted or called


def _single_prompt(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> str | Sequence[int]:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1 and all(isinstance(item, str | list) for item in prompt):
        msg = f"prompt holds {len(prompt)} prompts; send one prompt per request"
        raise InvalidInput(msg, param="prompt")
    first = prompt[0] if prompt else None
    if isinstance(first, str | list):
        return first
    return [item for item in prompt if isinstance(item, int)]


def completion_generation(
    body: CompletionRequest, *, controls: RequestControls, limits: GenerationConfig
) -> GenerationRequest:
    """The generation a legacy completion request asks for; one prompt (text or token ids)."""
    _check_stream_options(body)
    _refuse_unsupported(body)
    prompt = _single_prompt(body.prompt)
    if len(prompt) == 0:
        msg = "prompt must not be empty"
        raise InvalidInput(msg, param="prompt")
    if body.max_tokens == 0 and not body.echo:
        msg = "max_tokens must be at least 1 (0 only with echo: the prompt alone)"
        raise InvalidInput(msg, param="max_tokens")
    sampling = _with_logprobs(
        sampling_params(body, max_tokens=body.max_tokens, limits=limits),
        body.logprobs,
        echo=body.echo,
    )
    text, token_ids = (prompt, None) if isinstance(prompt, str) else (None, tuple(prompt))
    return GenerationRequest(
        sampling=sampling,
        prompt=text,
        prompt_token_ids=token_ids,
        n=_choices(body, body.max_tokens, limits),
        priority=controls.priority,
        timeout_s=controls.timeout_s,
        request_id=controls.request_id,
        cache_salt=body.cache_salt,
    )


def _with_logprobs(sampling: SamplingParams, top: int | None, *, echo: bool) -> SamplingParams:
    """`sampling` asking for `top` alternatives per token (None: no log-probabilities).

    With `echo`, the prompt comes back, and with `top` its log-probabilities too.
    """
    if top is None and not echo:
        return sampling
    prompt = top if echo else None
    return replace(sampling, logprobs=top, prompt_logprobs=prompt, echo=echo)
