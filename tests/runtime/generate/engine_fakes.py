"""Fakes the generative engine's tests share: a paged model that really reads its KV pages.

`PagedEcho` stores every token it computes in a slot of its own pool, found through the
chunk's block table, and derives the next token from the whole history it reads back the
same way. So the output depends on every block table the engine builds: a wrong table, a
preempted sequence recomputed from the wrong place, or a reused prefix block that holds
other tokens changes the text (or trips the position check). The tests compare outputs
across scheduling regimes that must not change them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry

from fleetserve_runtime.generate.contracts import (
    FinishEvent,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from fleetserve_runtime.generate.engine import GenerationEngine
from fleetserve_runtime.generate.limits import EngineLimits
from fleetserve_runtime.generate.metrics import GenerationMetrics
from fleetserve_runtime.generate.prompts import INLINE_PROMPT_CHARS
from fleetserve_runtime.generate.stream import GenerationStream
from fleetserve_runtime.models.causal_lm import ChatMessage, KVLayout, StepInput

VOCAB = 128
BOS, EOS = 1, 2


class AsciiDecoder:
    """Streams one character per printable token."""

    def push(self, token_id: int) -> str:
        """The token's character."""
        return chr(token_id) if token_id >= 32 else ""

    def flush(self) -> str:
        """Nothing is ever held back."""
        return ""


@dataclass
class AsciiCodec:
    """One token per ASCII character; BOS 1, end-of-sequence tokens configurable."""

    eos: frozenset[int] = frozenset({EOS})

    @property
    def bos_token_id(self) -> int | None:
        """BOS."""
        return BOS

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The configured end tokens."""
        return self.eos

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        """Character codes, BOS first when asked."""
        return ([BOS] if add_special else []) + [ord(c) % VOCAB for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Printable characters of the ids."""
        return "".join(chr(t) for t in token_ids if t >= 32)

    def decoder(self) -> AsciiDecoder:
        """A streaming decoder."""
        return AsciiDecoder()

    def encode_chat(self, messages: Sequence[ChatMessage], text: str) -> list[int]:
        """Character codes of the rendered text (no special tokens to forge)."""
        return self.encode(text, add_special=False)

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """Tagged messages; an unknown role is refused as a template would."""
        if any(m.role not in ("system", "user", "assistant") for m in messages):
            msg = "unknown role"
            raise ValueError(msg)
        return "".join(f"<{m.role}>{m.content}" for m in messages) + "<assistant>"


@dataclass
class GatedCodec(AsciiCodec):
    """`AsciiCodec` whose `encode` records its thread and, when `gate` is set, waits for it."""

    gate: threading.Event | None = None
    encoding: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        """Character codes, once the gate opens."""
        self.threads.append(threading.current_thread())
        self.encoding.set()
        if self.gate is not None:
            self.gate.wait(10)
        return super().encode(text, add_special=add_special)


@dataclass
class PagedEcho:
    """A causal LM whose next token is a function of the history it reads from its pages."""

    step_delay_s: float = 0.0
    fail_when: Callable[[StepInput], bool] | None = None
    gate: threading.Event | None = None
    """When set, every step waits for it (tests hold the worker inside a step)."""
    in_step: threading.Event = field(default_factory=threading.Event)
    steps: list[list[tuple[int, int]]] = field(default_factory=list)
    """Per step, each chunk's (start position, token count)."""
    wide: list[tuple[int, int]] = field(default_factory=list)
    """(start position, token count) of each chunk that asked for all its logits."""
    slots: list[list[tuple[int, int] | None]] = field(default_factory=list)
    block_size: int = 0

    @property
    def kv_layout(self) -> KVLayout:
        """One number per slot."""
        return KVLayout(num_layers=1, num_kv_heads=1, head_dim=1, dtype_bytes=4)

    @property
    def vocab_size(self) -> int:
        """ASCII."""
        return VOCAB

    def allocate_cache(self, num_blocks: int, block_size: int) -> None:
        """Empty slots, forgetting everything."""
        self.block_size = block_size
        self.slots = [[None] * block_size for _ in range(num_blocks)]

    def forward(self, step: StepInput) -> torch.Tensor:
        """Write each chunk's tokens, read its history back, return next-token logits."""
        self.in_step.set()
        if self.gate is not None:
            self.gate.wait()
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.fail_when is not None and self.fail_when(step):
            msg = "injected model failure"
            raise RuntimeError(msg)
        self.steps.append([(c.start_pos, len(c.token_ids)) for c in step.chunks])
        self.wide.extend((c.start_pos, len(c.token_ids)) for c in step.chunks if c.all_logits)
        bs = self.block_size
        rows = []
        for chunk in step.chunks:
            for offset, token in enumerate(chunk.token_ids):
                pos = chunk.start_pos + offset
                self.slots[chunk.block_table[pos // bs]][pos % bs] = (pos, token)
            history = []
            for pos in range(chunk.start_pos + len(chunk.token_ids)):
                entry = self.slots[chunk.block_table[pos // bs]][pos % bs]
                if entry is None or entry[0] != pos:
                    msg = f"slot for position {pos} holds {entry}"
                    raise AssertionError(msg)
                history.append(entry[1])
            ends = range(chunk.start_pos + 1, len(history) + 1) if chunk.all_logits else [None]
            rows.extend(self.logits(history[:end]) for end in ends)
        return torch.stack(rows)

    @staticmethod
    def logits(history: list[int]) -> torch.Tensor:
        """Lower-case letters only, with a unique maximum that depends on the whole history."""
        h = sum((pos + 1) * token for pos, token in enumerate(history)) % 1009
        row = torch.full((VOCAB,), -1e4)
        for j in range(26):
            row[97 + j] = ((h * 31 + j * 17) % 53) / 8
        return row


@dataclass
class Result:
    """What one stream produced."""

    text: str
    token_ids: list[int]
    finish: FinishEvent


async def collect(stream: GenerationStream) -> Result:
    text, ids = "", list[int]()
    async for event in stream:
        if isinstance(event, TokenEvent):
            text += event.text
            ids.extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            return Result(text, ids, event)
        else:
            raise event.error
    pytest.fail("the stream ended without a finish event")


def make_engine(
    lm: PagedEcho | None = None,
    *,
    codec: AsciiCodec | None = None,
    context_length: int = 512,
    registry: CollectorRegistry | None = None,
    **limits: object,
) -> GenerationEngine:
    settings: dict[str, object] = {
        "block_size": 4,
        "num_blocks": 512,
        "max_running_sequences": 8,
        "max_step_tokens": 32,
        "priority_aging_s": 0.0,
    }
    settings.update(limits)
    engine = GenerationEngine(
        lm=lm or PagedEcho(),
        codec=codec or AsciiCodec(),
        limits=EngineLimits(**settings),  # type: ignore[arg-type]
        metrics=GenerationMetrics(registry or CollectorRegistry(), model="m", track="stable"),
        context_length=context_length,
        version="v1",
    )
    engine.start()
    return engine


@asynccontextmanager
async def running_engine(
    lm: PagedEcho | None = None, **options: Any
) -> AsyncIterator[GenerationEngine]:
    """`make_engine(lm, **options)`, stopped on leaving; a gated `lm` is let go first."""
    engine = make_engine(lm, **options)
    try:
        yield engine
    finally:
        if lm is not None and lm.gate is not None:
            lm.gate.set()
        await engine.stop()


def request(prompt: str, max_tokens: int = 12, **sampling: object) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    if sampling:
        params = SamplingParams(max_tokens=max_tokens, **sampling)  # type: ignore[arg-type]
    return GenerationRequest(sampling=params, prompt=prompt)


SYSTEM = "You are a terse assistant who answers in one short line. "
PROMPTS = [
    (SYSTEM + "Question one?", 9),
    ("short", 30),
    (SYSTEM + "A much longer question that takes several chunks to prefill, surely.", 17),
    ("x", 5),
    (SYSTEM + "Question one? And two?", 24),
    ("mid sized prompt here", 11),
    (SYSTEM + "Question three.", 3),
    ("the last one", 20),
]


LONG_PROMPT = "y" * (INLINE_PROMPT_CHARS + 1)


async def run_all(engine: GenerationEngine) -> list[Result]:
    async def one(prompt: str, max_tokens: int) -> Result:
        return await collect(await engine.submit(request(prompt, max_tokens)))

    try:
        return await asyncio.gather(*(one(p, m) for p, m in PROMPTS))
    finally:
        await engine.stop()


async def one_at_a_time() -> list[Result]:
    async with running_engine(
        max_running_sequences=1, policy="static", prefix_caching=False
    ) as engine:
        return [await collect(await engine.submit(request(p, m))) for p, m in PROMPTS]


def texts(results: list[Result]) -> list[tuple[str, list[int], FinishReason, int]]:
    return [
        (r.text, r.token_ids, r.finish.reason, r.finish.usage.completion_tokens) for r in results
    ]
