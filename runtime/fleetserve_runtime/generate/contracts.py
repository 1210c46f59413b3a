"""The shapes that pass between the generative engine's parts, and the protocols they implement.

Data flows one way: `checkpoint` builds a `Checkpoint` (architecture, weights, `TextCodec`);
a `CausalLM` is built from it and owns the paged KV pool; the engine admits
`GenerationRequest`s, plans each step (`StepInput`), samples the logits the model returns and
streams `GenerationEvent`s back to the caller. Nothing here runs torch; the tensor types are
for the type checker only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from fleetserve_runtime.core.priority import Priority

if TYPE_CHECKING:
    import torch

__all__ = [
    "CausalLM",
    "ChatMessage",
    "Checkpoint",
    "ErrorEvent",
    "FinishEvent",
    "FinishReason",
    "GenerationEvent",
    "GenerationRequest",
    "IncrementalDecoder",
    "KVLayout",
    "LlamaConfig",
    "SamplingParams",
    "SeqChunk",
    "StepInput",
    "TextCodec",
    "TokenEvent",
    "Usage",
]


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """The architecture of a Llama-family decoder, as `config.json` or GGUF metadata give it."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    rope_scaling: Mapping[str, float | str] | None = None
    """Llama 3 style frequency scaling (`rope_type: llama3`, factors); None for plain RoPE."""


class IncrementalDecoder(Protocol):
    """Turns a stream of token ids into text deltas; holds back incomplete UTF-8 sequences."""

    def push(self, token_id: int) -> str:
        """The text this token completes (may be empty while a multi-byte character is open)."""
        ...

    def flush(self) -> str:
        """Whatever is still held back, at the end of the stream."""
        ...


class TextCodec(Protocol):
    """A model's tokenizer and chat template."""

    @property
    def bos_token_id(self) -> int | None:
        """Prepended when the model's tokenizer adds it (`encode(..., add_special=True)`)."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Tokens that end a generation (end-of-text and end-of-turn)."""
        ...

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        """Token ids of `text`; `add_special` adds what the tokenizer adds to a whole prompt."""
        ...

    def encode_chat(self, messages: Sequence[ChatMessage], text: str) -> list[int]:
        """Token ids of `text`, the `render_chat` prompt of `messages`.

        Text in a message that spells a special token stays text; only the template's own
        markers are special. Raises `ValueError` when that cannot be told apart.
        """
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens skipped."""
        ...

    def decoder(self) -> IncrementalDecoder:
        """A fresh streaming decoder for one sequence."""
        ...

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt the chat template makes of `messages`, ready for the assistant's turn.

        Raises `ValueError` (with the template's message) when the template refuses.
        """
        ...


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A loaded checkpoint: architecture, fp32 weights by Llama parameter name, tokenizer.

    Parameter names are those of the reference implementation (`model.embed_tokens.weight`,
    `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
    `model.layers.{i}.mlp.{gate,up,down}_proj.weight`,
    `model.layers.{i}.{input,post_attention}_layernorm.weight`, `model.norm.weight`,
    `lm_head.weight` unless tied), with q/k in the reference's (un-permuted) row order.
    """

    config: LlamaConfig
    weights: Mapping[str, torch.Tensor]
    codec: TextCodec
    source: str
    """Where it came from, for logs and the metadata endpoint."""


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What one KV block costs, so the pool can be sized from a byte budget."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    def block_bytes(self, block_size: int) -> int:
        """Bytes of one block of `block_size` token slots (keys and values, every layer)."""
        return (
            2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes * block_size
        )

    def gather_bytes(self, block_size: int, sequences: int, context: int) -> int:
        """Peak bytes, outside the pool, of attending over pages.

        One layer's keys and values of `sequences` rows with up to `context` positions each,
        padded to whole blocks: the scratch the gather reuses from layer to layer.
        """
        blocks = sequences * -(-context // block_size)
        return blocks * self.block_bytes(block_size) // self.num_layers


@dataclass(frozen=True, slots=True)
class SeqChunk:
    """One sequence's share of a step: new tokens appended after `start_pos` cached ones.

    A prefill chunk carries many tokens, a decode step one. The model writes the new tokens'
    keys and values into the slots `block_table` maps positions to (position p lives in block
    `block_table[p // block_size]`, slot `p % block_size`) and attends over positions
    `0 .. start_pos + len(token_ids) - 1`, reading positions before `start_pos` from the pool
    (computed by an earlier step, or shared from another sequence's identical prefix).
    """

    token_ids: Sequence[int]
    start_pos: int
    block_table: Sequence[int]


@dataclass(frozen=True, slots=True)
class StepInput:
    """One model step: every running sequence's chunk, flattened into one batch."""

    chunks: Sequence[SeqChunk]


class CausalLM(Protocol):
    """A decoder the engine can step; it owns the paged KV pool (`allocate_cache`)."""

    @property
    def kv_layout(self) -> KVLayout:
        """Per-block cost, for sizing the pool from the memory budget."""
        ...

    @property
    def vocab_size(self) -> int:
        """Width of the returned logits."""
        ...

    def allocate_cache(self, num_blocks: int, block_size: int) -> None:
        """(Re)allocate the pool: `num_blocks` blocks of `block_size` slots each; forgets all."""
        ...

    def forward(self, step: StepInput) -> torch.Tensor:
        """Run one step: fp32 logits `[len(step.chunks), vocab_size]`, in chunk order.

        One row per chunk, of its last token. Runs on the engine's worker thread.
        """
        ...


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat conversation."""

    role: str
    content: str


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


class FinishReason(StrEnum):
    """Why a sequence ended, in the OpenAI API's words."""

    STOP = "stop"
    """An end-of-sequence token or a stop string."""
    LENGTH = "length"
    """`max_tokens`, or the model's context, was reached."""


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
class TokenEvent:
    """New output: the text delta (stop strings already cut) and the token ids behind it."""

    text: str
    token_ids: tuple[int, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The last event of a successful generation."""

    reason: FinishReason
    usage: Usage


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The generation failed after it started streaming (e.g. its deadline passed)."""

    error: Exception


GenerationEvent = TokenEvent | FinishEvent | ErrorEvent
