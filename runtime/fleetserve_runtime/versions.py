"""Model versions: resolve, load, calibrate and warm a version off the event loop, then activate it.

`Runtime` calls `VersionLoader.load` for the configured model at start and for each load
through the model control API. Resolving imports and runs user code, and loading, measuring
memory (`memory.MemoryProfile`) and warming run the model on the executor's device: all of it
runs in a worker thread, one load at a time, so two loads of one label cannot both warm and
activate. The result goes into the `ModelRegistry`, which swaps versions without a gap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from fleetserve_runtime.batcher import BucketPolicy
from fleetserve_runtime.config import RuntimeConfig
from fleetserve_runtime.errors import InvalidInput
from fleetserve_runtime.executor import Executor
from fleetserve_runtime.memory import MemoryProfile
from fleetserve_runtime.models.registry import LoadedModel, ModelRegistry, resolve_handler

__all__ = ["CALIBRATION_TOKENS", "VersionLoader", "calibration_shapes", "warmup_shapes"]

log = logging.getLogger("fleetserve.runtime")

CALIBRATION_TOKENS = 1024
"""Largest padded-token count of one warmup batch; bounds warmup time on a CPU."""


def calibration_shapes(max_len: int) -> list[tuple[int, int]]:
    """(batch size, length) shapes whose peak memory fits the per-token cost."""
    short = min(8, max_len)
    mid = min(64, max_len)
    return [(1, short), (max(1, CALIBRATION_TOKENS // (4 * mid)), mid), (2, max_len)]


def warmup_shapes(edges: Sequence[int], max_batch_size: int) -> list[tuple[int, int]]:
    """One batch per bucket edge, as large as the warmup token cap allows."""
    return [(max(1, min(max_batch_size, CALIBRATION_TOKENS // edge)), edge) for edge in edges]


class VersionLoader:
    """Loads versions of one model name into `registry`; use from the event loop."""

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        registry: ModelRegistry,
        executor: Executor,
        buckets: BucketPolicy,
    ) -> None:
        self._config = config
        self._registry = registry
        self._executor = executor
        self._buckets = buckets
        self._lock = asyncio.Lock()
        self._generation = 0

    async def load(self, uri: str, version: str) -> LoadedModel:
        """Resolve, load, calibrate and warm `version` off the event loop, then make it active.

        A version that is already loaded is activated at once (instant switch back). Loads
        run one at a time, so two loads of one label cannot both warm and activate.
        """
        async with self._lock:
            if version in self._registry.versions():
                loaded = self._registry.get(version)
                if uri != loaded.uri:
                    msg = (
                        f"version {version!r} is already loaded from {loaded.uri!r}; "
                        "unload it before loading another model under that label"
                    )
                    raise InvalidInput(msg)
                self._registry.activate(loaded)
                return loaded
            # Resolving imports and runs user code (module:factory, handler.py): like loading
            # and warming, it may take long and must not stall the event loop.
            loaded = await asyncio.to_thread(self._load_and_warm, uri, version)
            self._generation += 1
            loaded = replace(loaded, uri=uri, generation=self._generation)
            self._registry.activate(loaded)
        log.info(
            "model ready",
            extra={"version": version, "load_seconds": round(loaded.load_seconds, 3)},
        )
        return loaded

    def _load_and_warm(self, uri: str, version: str) -> LoadedModel:
        started = time.perf_counter()
        batching, memory = self._config.batching, self._config.memory
        handler = resolve_handler(
            uri,
            name=self._config.name,
            version=version,
            max_sequence_length=batching.max_sequence_length,
        )
        weights = self._executor.load(handler)
        samples = self._executor.run_shapes(
            handler,
            calibration_shapes(batching.max_sequence_length),
            packed=batching.packing,
            measure=True,
        )
        if not samples:
            msg = "the model runs out of memory even on a batch of one short request"
            raise ValueError(msg)
        profile = MemoryProfile.fit(weights, samples)
        max_tokens = batching.max_batch_tokens
        if not max_tokens and memory.budget_bytes:
            max_tokens = profile.max_batch_tokens(memory.budget_bytes, memory.reserve_fraction)
            if max_tokens < batching.max_sequence_length:
                msg = (
                    f"memory.budget_bytes {memory.budget_bytes} cannot hold one request of "
                    f"max_sequence_length {batching.max_sequence_length}: the model needs "
                    f"{weights} bytes of weights + {profile.fixed_bytes} fixed + "
                    f"{profile.bytes_per_token:.0f} per token"
                )
                raise ValueError(msg)
        if self._config.warmup:
            shapes = warmup_shapes(self._buckets.edges, batching.max_batch_size)
            self._executor.run_shapes(handler, shapes, packed=batching.packing, measure=False)
        return LoadedModel(handler, time.perf_counter() - started, profile, max_tokens)
