"""A synthetic generative model: the engine's interfaces, a tunable step cost, no weights.

`builtin://synthetic-generate?per_token_ms=2&prefill_ms_per_token=0.05&output_tokens=16&error_rate=0&seed=0&vocab=64&context_length=4096`

Fast tests use it to drive the engine, the API and the runtime's memory sizing without a real
model, and the e2e tests use it to make a canary regress on purpose (latency, errors).

How it behaves, so tests can predict it:

- Text is words. `encode` maps every whitespace-separated word of a prompt to one *prompt
  token* (by hash); the model answers in *output tokens*, the `vocab` words of `WORDS`
  (numbered beyond the list's length). `decode` joins words with single spaces. With
  `output=ascii` (and `vocab=95`) the output tokens are the printable ASCII characters
  instead, decoded without spaces: text a grammar can hold to JSON (structured output).
- Its "KV cache" is real: the pool holds, for every cached position, a rolling hash of the
  sequence up to it and the length of the run of output tokens ending there. The next token is
  a function of that hash (and `seed`), so the output depends only on the sequence's tokens,
  never on how steps were batched, chunked, preempted or shared by prefix caching.
- After `output_tokens` output tokens in a row it emits end-of-sequence.
- A step costs `per_token_ms` (one pass over the weights, whatever the batch) plus
  `prefill_ms_per_token` for every token of its prefill chunks (chunks of more than one token).
- With `error_rate`, a generation is drawn to fail (deterministically, from its hash and
  `seed`) at the step that feeds its first output token back: that step raises
  `SyntheticStepError`, as a real model's failing forward pass would.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetserve_runtime.models.causal_lm import ChatMessage, KVLayout, StepInput

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PRINTABLE_ASCII",
    "PROMPT_BUCKETS",
    "WORDS",
    "SyntheticCodec",
    "SyntheticGenerativeParams",
    "SyntheticLM",
    "SyntheticStepError",
]

EOS_ID = 0
BOS_ID = 1
FIRST_OUTPUT_ID = 2
PROMPT_BUCKETS = 1024
"""Prompt words hash into this many prompt tokens (named `t<n>` when decoded)."""
CHOSEN_LOGIT = 30.0
"""Logit of the model's token (all others 0): sampling at any usual temperature picks it."""

WORDS = (
    "the", "a", "river", "stone", "light", "over", "under", "quiet", "green", "small",
    "bright", "runs", "falls", "sings", "holds", "and", "of", "to", "in", "wind",
    "field", "morning", "night", "sea", "city", "road", "fire", "snow", "bird", "song",
    "old", "new", "far", "near", "slowly", "again", "home", "door", "window", "cloud",
    "rain", "sun", "moon", "star", "tree", "leaf", "hill", "valley", "bridge", "tower",
    "gold", "silver", "iron", "glass", "paper", "story", "dream", "voice", "hand", "time",
    "day", "year", "world", "end",
)  # fmt: skip
"""The output vocabulary; `vocab` beyond its length numbers the words (`river2`)."""

_MASK = (1 << 64) - 1
_FIRST_PRINTABLE = 0x20
PRINTABLE_ASCII = 95
"""Output tokens with `output=ascii`: the characters from space to `~`."""


def _mix(value: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of a 64-bit value."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def _signed(value: int) -> int:
    """A 64-bit hash as int64, so it fits the pool tensor."""
    return value - (1 << 64) if value >= 1 << 63 else value


class SyntheticGenerativeParams(BaseModel):
    """Knobs of the synthetic generative model, parsed from the URI query."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_token_ms: float = Field(1.0, ge=0, le=60_000)
    """Cost of every step (one decode token for each running sequence), in milliseconds."""
    prefill_ms_per_token: float = Field(0.0, ge=0, le=60_000)
    """Added cost per prompt token computed in a step, in milliseconds."""
    output_tokens: int = Field(16, ge=1, le=1_000_000)
    """Output tokens before end-of-sequence."""
    error_rate: float = Field(0.0, ge=0, le=1)
    """Probability that a generation fails (its step raises); drawn from its hash and `seed`."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Changes every output and every error draw; the same seed reproduces a run."""
    vocab: int = Field(64, ge=1, le=4096)
    """Number of distinct output words."""
    context_length: int = Field(4096, ge=2, le=1_000_000)
    """Longest sequence (prompt plus output) the model accepts, in tokens."""
    output: Literal["words", "ascii"] = "words"
    """What output tokens spell: words, or one printable ASCII character each."""

    @model_validator(mode="after")
    def _ascii_vocabulary(self) -> SyntheticGenerativeParams:
        if self.output == "ascii" and self.vocab != PRINTABLE_ASCII:
            msg = f"output=ascii needs vocab={PRINTABLE_ASCII} (the printable characters)"
            raise ValueError(msg)
        return self


class SyntheticStepError(RuntimeError):
    """A step of the synthetic model failed on purpose (`error_rate`)."""


class _Decoder:
    """Word-per-token streaming: a space before every word but the first."""

    def __init__(self, codec: SyntheticCodec) -> None:
        self._codec = codec
        self._started = False

    def push(self, token_id: int) -> str:
        word = self._codec.word(token_id)
        if not word:
            return ""
        text = f" {word}" if self._started and not self._codec.ascii else word
        self._started = True
        return text

    def flush(self) -> str:
        return ""


class SyntheticCodec:
    """The synthetic model's tokenizer (words) and chat template (`role: content` lines)."""

    def __init__(self, vocab: int, *, ascii: bool = False) -> None:
        self._vocab = vocab
        self.ascii = ascii
        """Output tokens are characters, decoded without spaces (`output=ascii`)."""

    @property
    def vocab_size(self) -> int:
        """End-of-sequence, beginning-of-sequence, output words, prompt buckets."""
        return FIRST_OUTPUT_ID + self._vocab + PROMPT_BUCKETS

    @property
    def bos_token_id(self) -> int | None:
        """Prepended to whole prompts."""
        return BOS_ID

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The one end-of-sequence token."""
        return frozenset({EOS_ID})

    def is_output(self, token_id: int) -> bool:
        """True for the model's own output words."""
        return FIRST_OUTPUT_ID <= token_id < FIRST_OUTPUT_ID + self._vocab

    def word(self, token_id: int) -> str:
        """The text of one token; empty for the special tokens."""
        if token_id in (EOS_ID, BOS_ID):
            return ""
        if self.is_output(token_id):
            index = token_id - FIRST_OUTPUT_ID
            if self.ascii:
                return chr(_FIRST_PRINTABLE + index)
            base = WORDS[index % len(WORDS)]
            return base if index < len(WORDS) else f"{base}{index // len(WORDS)}"
        if FIRST_OUTPUT_ID + self._vocab <= token_id < self.vocab_size:
            return f"t{token_id - FIRST_OUTPUT_ID - self._vocab}"
        msg = f"token id {token_id} is outside the vocabulary of {self.vocab_size}"
        raise ValueError(msg)

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        """One prompt token per word (by hash), after BOS when `add_special`."""
        first_prompt = FIRST_OUTPUT_ID + self._vocab
        ids = [
            first_prompt
            + int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big")
            % PROMPT_BUCKETS
            for word in text.split()
        ]
        return [BOS_ID, *ids] if add_special else ids

    def encode_chat(self, messages: Sequence[ChatMessage], text: str) -> list[int]:
        """`encode(text)`: no word is a special token, so none can be spelled in a message."""
        return self.encode(text, add_special=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Words joined by single spaces (characters by nothing); special tokens skipped."""
        return ("" if self.ascii else " ").join(word for word in map(self.word, token_ids) if word)

    def decoder(self) -> _Decoder:
        """A fresh streaming decoder."""
        return _Decoder(self)

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """`role: content` per message, then `assistant:` for the answer."""
        lines = [f"{message.role}: {message.content}" for message in messages]
        return "\n".join([*lines, "assistant:"])


class SyntheticLM:
    """The synthetic `CausalLM`: a real pool of per-position state, and a sleep per step."""

    LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=1, dtype_bytes=8)
    """Per position: an int64 "key" (the rolling hash) and "value" (the output run length)."""

    def __init__(
        self, params: SyntheticGenerativeParams, codec: SyntheticCodec, device: torch.device
    ) -> None:
        self._params = params
        self._codec = codec
        self._device = device
        self._pool: torch.Tensor | None = None
        self._block_size = 0

    @property
    def kv_layout(self) -> KVLayout:
        """Sixteen bytes per cached position."""
        return self.LAYOUT

    @property
    def vocab_size(self) -> int:
        """Width of the returned logits."""
        return self._codec.vocab_size

    def allocate_cache(self, num_blocks: int, block_size: int) -> None:
        """A pool of `num_blocks` × `block_size` positions; forgets all."""
        # Drop the old pool first, so two pools never coexist at the peak.
        self._pool = None
        self._pool = torch.zeros(
            (num_blocks * block_size, 2), dtype=torch.int64, device=self._device
        )
        self._block_size = block_size

    def forward(self, step: StepInput) -> torch.Tensor:
        """Record each chunk's positions in the pool, sleep the step's cost, return logits."""
        pool = self._pool
        if pool is None:
            msg = "allocate_cache must run before the first step"
            raise RuntimeError(msg)
        params = self._params
        started = time.perf_counter()
        slots: list[int] = []
        states: list[tuple[int, int]] = []
        chosen: list[int] = []
        failing = 0
        prefill_tokens = 0
        for chunk in step.chunks:
            if len(chunk.token_ids) > 1:
                prefill_tokens += len(chunk.token_ids)
            state = self._state_before(pool, chunk.start_pos, chunk.block_table)
            for offset, token in enumerate(chunk.token_ids):
                state = self._advance(state, token)
                slots.append(self._slot(chunk.start_pos + offset, chunk.block_table))
                states.append(state)
            digest, run = state
            if run == 1 and params.error_rate and self._draw(digest, 1) < params.error_rate:
                failing += 1
            rows = states[-len(chunk.token_ids) :] if chunk.all_logits else [state]
            chosen.extend(self._next_token(row) for row in rows)
        if slots:
            pool[torch.tensor(slots, device=pool.device)] = torch.tensor(
                [(_signed(digest), run) for digest, run in states],
                dtype=torch.int64,
                device=pool.device,
            )
        cost_s = (params.per_token_ms + params.prefill_ms_per_token * prefill_tokens) / 1000
        time.sleep(max(0.0, cost_s - (time.perf_counter() - started)))
        if failing:
            msg = f"synthetic step failure (error_rate) in {failing} sequence(s)"
            raise SyntheticStepError(msg)
        logits = torch.zeros((len(chosen), self.vocab_size), dtype=torch.float32)
        logits[torch.arange(len(chosen)), torch.tensor(chosen, dtype=torch.int64)] = CHOSEN_LOGIT
        return logits.to(self._device)

    def _next_token(self, state: tuple[int, int]) -> int:
        """The token the logits after `state` make certain."""
        digest, run = state
        if run >= self._params.output_tokens:
            return EOS_ID
        return FIRST_OUTPUT_ID + self._draw_index(digest, self._params.vocab)

    def _slot(self, position: int, block_table: Sequence[int]) -> int:
        return block_table[position // self._block_size] * self._block_size + (
            position % self._block_size
        )

    def _state_before(
        self, pool: torch.Tensor, start_pos: int, block_table: Sequence[int]
    ) -> tuple[int, int]:
        """The (hash, run) cached at `start_pos - 1`, or the seed's start state at 0."""
        if start_pos == 0:
            return _mix(self._params.seed), 0
        digest, run = pool[self._slot(start_pos - 1, block_table)].tolist()
        return digest & _MASK, run

    def _advance(self, state: tuple[int, int], token: int) -> tuple[int, int]:
        digest, run = state
        return _mix(digest ^ _mix(token)), run + 1 if self._codec.is_output(token) else 0

    def _draw(self, digest: int, salt: int) -> float:
        """A uniform draw in [0, 1) fixed by the sequence's hash, the seed and `salt`."""
        return _mix(digest ^ _mix(self._params.seed + salt)) / 2.0**64

    def _draw_index(self, digest: int, size: int) -> int:
        return _mix(digest ^ _mix(self._params.seed)) % size
