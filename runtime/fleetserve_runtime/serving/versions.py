"""Model versions: resolve, load, calibrate and warm a version off the event loop, then activate it.

`Runtime` calls `VersionLoader.load` for the configured model at start and for each load
through the model control API. Resolving imports and runs user code, and loading, measuring
memory (`core.memory.MemoryProfile`) and warming run the model on the executor's device: all of it
runs in a worker thread, one load at a time, so two loads of one label cannot both warm and
activate. The result goes into the `ModelRegistry`, which swaps versions without a gap.

A generative version is measured the same way (its weights as loading retains them, then the
peak of one step of `generation.max_step_tokens` prompt tokens), and what the budget leaves
becomes its KV pool (`kv_pool_blocks`). Each generative version gets its own engine
(`make_engine`), started and warmed by one real request before the version is activated, so
a generative replica is ready only once a request has run end to end. New requests go to the
active version's engine, while a version that left the registry keeps its engine until its
streams end (`retire`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace

from fleetserve_runtime.core.auth import uri_refusal
from fleetserve_runtime.core.config import RuntimeConfig
from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.core.memory import MemoryProfile, measure_bytes
from fleetserve_runtime.encoder.batcher import BucketPolicy
from fleetserve_runtime.encoder.executor import Executor
from fleetserve_runtime.generate.contracts import ErrorEvent, GenerationRequest, SamplingParams
from fleetserve_runtime.generate.engine import GenerationEngine
from fleetserve_runtime.models.accuracy import PrecisionOptions
from fleetserve_runtime.models.base import DeclaresWeights
from fleetserve_runtime.models.causal_lm import SeqChunk, StepInput
from fleetserve_runtime.models.generative import GenerativeHandler, GenerativeOptions
from fleetserve_runtime.models.registry import (
    KVFigures,
    LoadedModel,
    ModelRegistry,
    resolve_handler,
)

__all__ = [
    "CALIBRATION_TOKENS",
    "VersionLoader",
    "calibration_shapes",
    "kv_pool_blocks",
    "warmup_shapes",
]

log = logging.getLogger("fleetserve.runtime")

CALIBRATION_TOKENS = 1024
"""Largest padded-token count of one warmup batch; bounds warmup time on a CPU."""


def calibration_shapes(max_len: int) -> list[tuple[int, int]]:
    """(batch size, length) shapes whose peak memory fits the per-token cost, smallest first.

    Smallest first, so memory a larger batch leaves behind cannot hide a smaller one's cost
    from a measurement of resident memory (`core.memory.resident_peak_bytes`).
    """
    short = min(8, max_len)
    mid = min(64, max_len)
    shapes = [(1, short), (max(1, CALIBRATION_TOKENS // (4 * mid)), mid), (2, max_len)]
    return sorted(shapes, key=lambda shape: shape[0] * shape[1])


def warmup_shapes(edges: Sequence[int], max_batch_size: int) -> list[tuple[int, int]]:
    """One batch per bucket edge, as large as the warmup token cap allows."""
    return [(max(1, min(max_batch_size, CALIBRATION_TOKENS // edge)), edge) for edge in edges]


def kv_pool_blocks(
    config: RuntimeConfig,
    *,
    weights_bytes: int,
    activation_bytes: int,
    held_bytes: int,
    block_bytes: int,
    context_length: int,
) -> int:
    """KV blocks of a generative version: what the memory budget leaves, or a default.

    With a budget: (budget × (1 − reserve_fraction) − bytes other loaded versions hold −
    weights − activations) × kv_cache_fraction, in whole blocks, where the activations are one
    `max_step_tokens` step's measured peak plus the scratch of attending over
    `max_running_sequences` full contexts. Unbounded
    (budget 0): max_running_sequences full contexts, at most `unbounded_kv_bytes`. Either
    way the pool must hold one full context, or a request that fits the context could never
    finish: `ValueError` naming the shortfall otherwise.
    """
    generation, memory = config.generation, config.memory
    one_sequence = math.ceil(context_length / generation.block_size)
    if not memory.budget_bytes:
        wanted = generation.max_running_sequences * one_sequence
        return max(one_sequence, min(wanted, generation.unbounded_kv_bytes // block_bytes))
    usable = int(memory.budget_bytes * (1 - memory.reserve_fraction))
    left = usable - held_bytes - weights_bytes - activation_bytes
    blocks = int(max(0, left) * generation.kv_cache_fraction) // block_bytes
    if blocks >= one_sequence:
        return blocks
    need = one_sequence * block_bytes
    have = blocks * block_bytes
    held = f" - {held_bytes} held by other loaded versions" if held_bytes else ""
    msg = (
        f"memory.budget_bytes {memory.budget_bytes} is too small for this model: "
        f"{usable} usable bytes (after reserve_fraction {memory.reserve_fraction}){held} - "
        f"{weights_bytes} weights - {activation_bytes} activations (one "
        f"{generation.max_step_tokens}-token step, and attention over "
        f"{generation.max_running_sequences} full contexts) leave {have} bytes of KV cache "
        f"(kv_cache_fraction {generation.kv_cache_fraction}), but one {context_length}-token "
        f"context needs {one_sequence} blocks of {block_bytes} bytes = {need} bytes: "
        f"{need - have} bytes short; raise the budget, or lower generation.max_context, "
        "generation.max_running_sequences or generation.max_step_tokens"
    )
    raise ValueError(msg)


@dataclass(eq=False)
class VersionLoader:
    """Loads versions of one model name into `registry`; use from the event loop."""

    config: RuntimeConfig
    _: KW_ONLY
    registry: ModelRegistry[GenerationEngine]
    executor: Executor
    buckets: BucketPolicy
    make_engine: Callable[[LoadedModel], GenerationEngine]
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _generation: int = field(default=0, init=False)
    _engines: dict[int, tuple[LoadedModel, GenerationEngine]] = field(
        default_factory=dict, init=False
    )
    """Running engines by load generation, retired ones included until they stop."""
    _retiring: dict[asyncio.Task[None], GenerationEngine] = field(default_factory=dict, init=False)
    """Engines waiting for their last streams, by the task that stops them."""

    async def load(self, uri: str, version: str) -> LoadedModel:
        """Resolve, load, calibrate and warm `version` off the event loop, then make it active.

        A version that is already loaded is activated at once (instant switch back). Loads
        run one at a time, so two loads of one label cannot both warm and activate.
        """
        async with self._lock:
            if version in self.registry.versions():
                loaded = self.registry.get(version)
                if uri != loaded.uri:
                    msg = (
                        f"version {version!r} is already loaded from {loaded.uri!r}; "
                        "unload it before loading another model under that label"
                    )
                    raise InvalidInput(msg)
                self.registry.activate(loaded)
                return loaded
            # Resolving imports and runs user code (module:factory, handler.py): like loading
            # and warming, it may take long and must not stall the event loop.
            loaded = await asyncio.to_thread(self._load_and_warm, uri, version)
            self._generation += 1
            loaded = replace(loaded, uri=uri, generation=self._generation)
            if loaded.generative is not None:
                loaded = await self._serve(loaded)
            self.registry.activate(loaded)
            self.retire()
        log.info(
            "model ready",
            extra={
                "version": version,
                "load_seconds": round(loaded.load_seconds, 3),
                "platform": loaded.metadata.platform,
                "precision": loaded.metadata.precision,
                # The guards' figures: how close to fp32 a reduced precision came, how fast.
                "min_cosine": loaded.metadata.min_cosine,
                "speedup": loaded.metadata.speedup,
            },
        )
        return loaded

    async def _serve(self, loaded: LoadedModel) -> LoadedModel:
        """Start the version's engine (it allocates the KV pool) and warm it up."""
        engine = self.make_engine(loaded)
        # Allocating a pool of many blocks takes a while: not on the event loop.
        await asyncio.to_thread(engine.start)
        try:
            if self.config.warmup:
                await _warm(engine)
        except BaseException:
            await engine.stop()
            raise
        self._engines[loaded.generation] = (loaded, engine)
        return replace(loaded, engine=engine)

    def retire(self) -> None:
        """Stop the engines of versions that left the registry, once their streams end.

        A stream already admitted keeps its version: the engine takes no new request (none
        can reach it through the registry) and stops when it is idle, or when the longest
        deadline a request may have passed.
        """
        current = {self.registry.get(version).generation for version in self.registry.versions()}
        for generation in [g for g in self._engines if g not in current]:
            loaded, engine = self._engines.pop(generation)
            task = asyncio.create_task(
                self._drain(engine), name=f"fleetserve-retire-{loaded.version}"
            )
            self._retiring[task] = engine
            task.add_done_callback(self._retiring.pop)

    async def _drain(self, engine: GenerationEngine) -> None:
        deadline = time.monotonic() + self.config.generation.max_timeout_ms / 1000
        while time.monotonic() < deadline and engine.open_streams:
            await asyncio.sleep(0.05)
        await engine.stop()

    async def stop(self) -> None:
        """Stop every engine now (shutdown): streams still running fail."""
        retiring = list(self._retiring.items())
        engines = [engine for _, engine in self._engines.values()]
        self._engines = {}
        for task, engine in retiring:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            engines.append(engine)
        for engine in engines:
            await engine.stop()

    def _plugins_allowed(self, uri: str) -> bool:
        """Whether a `handler.py` in `uri`'s directory may run.

        Files brought from elsewhere (`model_source` set: a fetched model) are the store's
        content, not the image's: their code runs only as the allowlist admits code, by an
        `allowed_model_uris` entry equal to the URI.
        """
        config = self.config
        if config.model_source is None:
            return True
        allowed = config.allowed_model_uris
        refusal = uri_refusal(uri, allowed, is_directory=os.path.isdir, real_path=os.path.realpath)
        return refusal is None

    def _load_and_warm(self, uri: str, version: str) -> LoadedModel:
        started = time.perf_counter()
        batching, memory = self.config.batching, self.config.memory
        handler = resolve_handler(
            uri,
            name=self.config.name,
            version=version,
            max_sequence_length=batching.max_sequence_length,
            generative=GenerativeOptions(
                max_context=self.config.generation.max_context,
                dtype=self.config.generation.dtype,
            ),
            precision=PrecisionOptions(
                self.config.precision,
                self.config.precision_min_cosine,
                self.config.precision_min_speedup,
            ),
            backend=self.config.backend,
            device=self.executor.device.type,
            task=self.config.task,
            plugins=self._plugins_allowed(uri),
        )
        if isinstance(handler, GenerativeHandler):
            return self._load_generative(handler, started)
        weights = self.executor.load(handler)
        if isinstance(handler, DeclaresWeights):
            weights = max(weights, handler.weights_bytes())
        samples = self.executor.run_shapes(
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
        if self.config.warmup:
            shapes = warmup_shapes(self.buckets.edges, batching.max_batch_size)
            self.executor.run_shapes(handler, shapes, packed=batching.packing, measure=False)
        return LoadedModel(handler, time.perf_counter() - started, profile, max_tokens)

    def _load_generative(self, handler: GenerativeHandler, started: float) -> LoadedModel:
        """Load, measure one step's activations in a small pool, size the KV pool.

        The engine allocates the pool itself when it starts (`_serve`).
        """
        generation = self.config.generation
        device = self.executor.device
        retained = measure_bytes(lambda: handler.load(device), device)[1]
        weights = max(retained, handler.weights_bytes())
        lm, codec, context = handler.lm, handler.codec, handler.context_length
        block_bytes = lm.kv_layout.block_bytes(generation.block_size)
        step_tokens = min(generation.max_step_tokens, context)
        sample = codec.encode("hello", add_special=False) or [0]
        prompt = (sample * step_tokens)[:step_tokens]
        step_blocks = math.ceil(step_tokens / generation.block_size)
        lm.allocate_cache(step_blocks, generation.block_size)
        step = StepInput([SeqChunk(prompt, 0, list(range(step_blocks)))])
        # The prefill step is measured; a full decode batch's gather scratch (one layer's
        # keys and values of every running sequence, at full context) is not reached by it,
        # so it is added by its exact size.
        gather = lm.kv_layout.gather_bytes(
            generation.block_size, generation.max_running_sequences, context
        )
        activation = measure_bytes(lambda: lm.forward(step), device)[0] + gather
        held = sum(
            (m.memory.weights_bytes + m.memory.fixed_bytes if m.memory else 0)
            for m in map(self.registry.get, self.registry.versions())
        )
        blocks = kv_pool_blocks(
            self.config,
            weights_bytes=weights,
            activation_bytes=activation,
            held_bytes=held,
            block_bytes=block_bytes,
            context_length=context,
        )
        kv = KVFigures(
            num_blocks=blocks,
            block_size=generation.block_size,
            block_bytes=block_bytes,
            activation_bytes=activation,
        )
        # The pool is allocated once and held: to the budget it is fixed memory, like the
        # step's activations, and nothing grows per token.
        profile = MemoryProfile(
            weights_bytes=weights, fixed_bytes=activation + kv.pool_bytes, bytes_per_token=0.0
        )
        return LoadedModel(
            handler, time.perf_counter() - started, profile, generation.max_step_tokens, kv=kv
        )


WARMUP_PROMPT = "Hello"


async def _warm(engine: GenerationEngine) -> None:
    """One greedy token through the engine: tokenizer, a prefill step, sampling, decoding."""
    stream = await engine.submit(
        GenerationRequest(SamplingParams(max_tokens=1, temperature=0.0), prompt=WARMUP_PROMPT)
    )
    try:
        async for event in stream:
            if isinstance(event, ErrorEvent):
                msg = f"the warm-up generation failed: {event.error}"
                raise RuntimeError(msg) from event.error
    finally:
        await stream.aclose()
