"""A synthetic model whose latency, error rate and memory limit are set by URI parameters.

`builtin://synthetic?latency_ms=5&per_item_ms=0.2&error_rate=0.2&errors_after_s=0&dim=8&seed=0&oom_above_tokens=0&stall_ms=0&collate_stall_ms=0`

The e2e tests use it to make a canary regress on purpose (errors, latency; with
`errors_after_s`, errors only from that long after it loaded: a version that regresses once
it has passed its canary steps), and the unit tests use `oom_above_tokens` to drive the
executor's split-on-OOM path with a real handler and `stall_ms` (`collate_stall_ms`) to
wedge the executor's compute (prepare) thread on one batch (the one holding the text
`stall`) while calibration and every other batch stay fast.
Instances are non-empty strings; an instance costs one token per whitespace-separated word
plus two (as a BERT tokenizer's [CLS]/[SEP] would).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fleetserve_runtime.core.errors import InputTooLong, InvalidInput, OutOfMemory
from fleetserve_runtime.models.base import (
    CollateContext,
    ItemError,
    ItemResult,
    ModelMetadata,
    PreparedInput,
    text_encoder_metadata,
)

__all__ = ["STALL_TEXT", "SyntheticHandler", "SyntheticParams", "text_digest"]

STALL_TEXT = "stall"
"""The instance whose batch sleeps an extra `stall_ms`."""


def text_digest(text: str) -> int:
    """The 32-bit digest the synthetic model derives an instance's output from."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")


class SyntheticParams(BaseModel):
    """Knobs of the synthetic model, parsed from the URI query."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_ms: float = Field(1.0, ge=0, le=60_000)
    """Fixed cost of one forward pass, in milliseconds."""
    per_item_ms: float = Field(0.05, ge=0, le=60_000)
    """Added cost per item in the batch, in milliseconds."""
    error_rate: float = Field(0.0, ge=0, le=1)
    """Probability that an item fails (its request gets 500)."""
    errors_after_s: float = Field(0.0, ge=0, le=3600)
    """`error_rate` applies only from this many seconds after `load`; before, none fails."""
    dim: int = Field(8, ge=1, le=4096)
    """Output vector size."""
    seed: int = 0
    """Seed of the error draws, so a run is reproducible."""
    oom_above_tokens: int = Field(0, ge=0)
    """Raise OutOfMemory for batches over this many padded tokens; 0 never."""
    stall_ms: float = Field(0.0, ge=0, le=600_000)
    """Extra sleep of a batch holding the instance `stall`, in milliseconds."""
    collate_stall_ms: float = Field(0.0, ge=0, le=600_000)
    """Sleep while collating a batch holding the instance `stall`, in milliseconds."""


class SyntheticHandler:
    """Deterministic vectors after a configurable sleep; see the module docstring."""

    def __init__(
        self,
        name: str,
        version: str,
        *,
        max_sequence_length: int = 256,
        params: SyntheticParams | None = None,
    ) -> None:
        self.params = params or SyntheticParams()
        self._metadata = text_encoder_metadata(
            name,
            version,
            platform="synthetic",
            width=self.params.dim,
            max_sequence_length=max_sequence_length,
        )
        self._rng = random.Random(self.params.seed)
        self._stall_digest = text_digest(STALL_TEXT)
        self._rng_lock = threading.Lock()
        self._errors_from = time.monotonic() + self.params.errors_after_s

    @property
    def metadata(self) -> ModelMetadata:
        """Name, version, shapes and limits."""
        return self._metadata

    def load(self, device: torch.device) -> None:
        """Nothing to load (no weights); `errors_after_s` counts from here."""
        self._errors_from = time.monotonic() + self.params.errors_after_s

    def preprocess(self, instance: object, *, truncate: bool) -> PreparedInput:
        """Count words; refuse non-strings, empty strings and over-long inputs."""
        if not isinstance(instance, str):
            msg = f"instance must be a string, got {type(instance).__name__}"
            raise InvalidInput(msg)
        words = instance.split()
        if not words:
            msg = "instance must be a non-empty string"
            raise InvalidInput(msg)
        limit = self._metadata.max_sequence_length
        length = len(words) + 2
        if length > limit and not truncate:
            msg = f"input is {length} tokens, over max_sequence_length {limit}"
            raise InputTooLong(msg)
        return PreparedInput(
            length=min(length, limit), data=text_digest(instance), truncated=length > limit
        )

    def sample_instance(self, length: int) -> object:
        """A string of `length - 2` words."""
        return " ".join(["word"] * max(1, length - 2))

    def collate(self, items: Sequence[PreparedInput], ctx: CollateContext) -> Any:
        """Pack the per-item digests and the padded token count."""
        if self.params.collate_stall_ms and any(i.data == self._stall_digest for i in items):
            time.sleep(self.params.collate_stall_ms / 1000)
        seeds = ctx.alloc.empty((len(items),), torch.int64)
        for row, item in enumerate(items):
            seeds[row] = item.data
        padded = len(items) * ctx.layout.pad_to
        return seeds.to(ctx.device), padded

    def forward(self, batch: Any) -> Any:
        """Sleep for the configured cost, then derive vectors from the digests."""
        seeds, padded = batch
        count = int(seeds.shape[0])
        limit = self.params.oom_above_tokens
        if limit and padded > limit:
            msg = f"synthetic OOM: batch of {padded} padded tokens over {limit}"
            raise OutOfMemory(msg)
        sleep_ms = self.params.latency_ms + self.params.per_item_ms * count
        if self.params.stall_ms and bool(seeds.eq(self._stall_digest).any()):
            sleep_ms += self.params.stall_ms
        time.sleep(sleep_ms / 1000)
        rate = self.params.error_rate if time.monotonic() >= self._errors_from else 0.0
        with self._rng_lock:
            failed = [self._rng.random() < rate for _ in range(count)]
        columns = torch.arange(self.params.dim, dtype=torch.float32, device=seeds.device)
        vectors = torch.sin(seeds.to(torch.float32).unsqueeze(1) + columns)
        return vectors, failed

    def postprocess(self, output: Any, count: int) -> list[ItemResult]:
        """One vector per item, or an `ItemError` for items drawn to fail."""
        vectors, failed = output
        rows: np.ndarray = vectors.cpu().numpy()
        return [
            ItemError("synthetic failure (error_rate)") if failed[i] else rows[i]
            for i in range(count)
        ]
