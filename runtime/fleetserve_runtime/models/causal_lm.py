"""What a generative model offers the generative engine: a causal LM stepped over paged KV blocks.

The generative counterpart of `models.base` (the encoder's handler protocol). A `CausalLM`
owns its paged KV pool (sized from `KVLayout`) and runs one `StepInput` (every running
sequence's `SeqChunk`, prefill and decode together) per call; a `TextCodec` is its tokenizer
and chat template. The engine (`generate.engine`) depends on these protocols, never on a
model's code. Nothing here runs torch; the tensor types are for the type checker only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

__all__ = [
    "CausalLM",
    "ChatMessage",
    "IncrementalDecoder",
    "KVLayout",
    "SeqChunk",
    "StepInput",
    "TextCodec",
]


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
class ChatMessage:
    """One message of a chat conversation."""

    role: str
    content: str


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
    all_logits: bool = False
    """Return the logits of every token of the chunk, not only of its last: a prompt's
    log-probabilities need them, and nothing else pays for the rows."""


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
        """Run one step: fp32 logits `[rows, vocab_size]`, in chunk order.

        One row per chunk, of its last token; a chunk with `all_logits` has one row per
        token instead, in position order (its last row is still its last token's). Runs on
        the engine's worker thread.
        """
        ...
