"""A generative model served by the real `Runtime`: memory sizing, streams, version swaps.

The synthetic generative model makes most checks fast and exact (its text is a function of
prompt and seed); one test loads SmolLM2 through `builtin://smollm2-135m` end to end.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
import torch
from pydantic import ValidationError

from fleetserve_runtime.cli import parse_config
from fleetserve_runtime.core.errors import InputTooLong, InvalidInput, ModelNotReady
from fleetserve_runtime.core.liveness import Liveness
from fleetserve_runtime.encoder.engine import InferenceCall
from fleetserve_runtime.generate.contracts import (
    ErrorEvent,
    FinishEvent,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from fleetserve_runtime.generate.stream import GenerationStream
from fleetserve_runtime.models.causal_lm import StepInput
from fleetserve_runtime.models.llama.config import Checkpoint
from fleetserve_runtime.models.synthetic_lm import SyntheticLM
from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import make_config, until

SYNTHETIC = "builtin://synthetic-generate?per_token_ms=0&output_tokens=6"
BLOCK_BYTES = 16 * 16
"""The synthetic model's 16 bytes per position, times the default block size."""


@asynccontextmanager
async def serving(model: str = SYNTHETIC, **overrides: Any) -> AsyncIterator[Runtime]:
    """A started `Runtime` serving `model`, stopped afterwards (not waited ready)."""
    runtime = Runtime(make_config(model=model, **overrides))
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


def request(prompt: str, max_tokens: int = 32, **fields: Any) -> GenerationRequest:
    return GenerationRequest(
        SamplingParams(max_tokens=max_tokens, temperature=0.0), prompt=prompt, **fields
    )


async def collect(stream: GenerationStream) -> tuple[str, GenerationEvent]:
    """The streamed text and the last event."""
    text = ""
    last: GenerationEvent | None = None
    async for event in stream:
        last = event
        if isinstance(event, TokenEvent):
            text += event.text
    assert last is not None
    return text, last


async def test_generates_with_the_synthetic_model() -> None:
    """A prompt streams `output_tokens` words, then finishes with stop and its usage."""
    async with serving() as runtime:
        await runtime.wait_ready()
        assert runtime.is_generative
        assert runtime.is_ready
        info = runtime.generation_info()
        assert (info.model, info.version, info.context_length) == ("test", "v1", 4096)
        text, last = await collect(await runtime.generate(request("The capital of France is")))
        again, _ = await collect(await runtime.generate(request("The capital of France is")))
    assert isinstance(last, FinishEvent)
    assert last.reason is FinishReason.STOP
    assert last.usage.completion_tokens == 7
    assert last.usage.prompt_tokens == 6
    assert len(text.split(" ")) == 6
    assert again == text


async def test_kv_pool_is_what_the_budget_leaves_after_measured_weights_and_step() -> None:
    """Blocks: (budget × (1 − reserve) − weights − activations) × fraction / block.

    The activations are the measured peak of one step plus the exact scratch of attending
    over every running sequence's full context (16 bytes per position of the synthetic model).
    """
    budget, reserve, fraction = 4_000_000, 0.25, 0.5
    gather = 32 * 4096 * 16
    async with serving(
        memory={"budget_bytes": budget, "reserve_fraction": reserve},
        generation={"kv_cache_fraction": fraction, "max_step_tokens": 256},
    ) as runtime:
        loaded = await runtime.wait_ready()
        kv, memory = loaded.kv, loaded.memory
        assert kv is not None
        assert memory is not None
        assert kv.activation_bytes > gather, "the step's activations were not measured"
        left = int(budget * (1 - reserve)) - memory.weights_bytes - kv.activation_bytes
        assert kv.num_blocks == int(left * fraction) // BLOCK_BYTES
        assert kv.block_bytes == BLOCK_BYTES
        assert memory.fixed_bytes == kv.activation_bytes + kv.num_blocks * BLOCK_BYTES
        stats = loaded.engine.stats() if loaded.engine else None
        assert stats is not None
        assert stats.num_blocks == kv.num_blocks
        described = runtime.describe(loaded)["kv_cache"]
        assert described["num_blocks"] == kv.num_blocks
        assert described["pool_bytes"] == kv.num_blocks * BLOCK_BYTES
        assert described["token_capacity"] == kv.num_blocks * 16
        assert described["free_blocks"] == kv.num_blocks
        assert described["usage_ratio"] == 0.0
        snapshot = runtime.snapshot().models["v1"]
        assert snapshot["kv_cache_blocks"] == kv.num_blocks


async def test_a_budget_too_small_for_one_context_fails_the_load_naming_the_shortfall() -> None:
    """A pool that cannot hold one full context is refused at load, with the numbers."""
    async with serving(
        model=f"{SYNTHETIC}&context_length=4096",
        memory={"budget_bytes": 60_000, "reserve_fraction": 0.0},
    ) as runtime:
        with pytest.raises(ValueError, match="too small") as failure:
            await runtime.wait_ready()
    message = str(failure.value)
    need = 4096 // 16 * BLOCK_BYTES
    assert f"256 blocks of {BLOCK_BYTES} bytes = {need} bytes" in message
    have = int(message.split(" bytes of KV cache")[0].rsplit(" ", 1)[1])
    assert f"{need - have} bytes short" in message
    assert not runtime.is_ready


async def test_a_second_version_gets_what_the_first_leaves_of_the_budget() -> None:
    """Two loaded versions share one budget: the new pool excludes what the old one holds.

    Halving what is left each time, the third version's pool would be too small to load.
    """
    budget = 1_200_000
    async with serving(
        memory={"budget_bytes": budget, "reserve_fraction": 0.0},
        generation={"kv_cache_fraction": 0.5, "max_step_tokens": 64, "max_running_sequences": 2},
    ) as runtime:
        first = await runtime.wait_ready()
        second = await runtime.load_version(f"{SYNTHETIC}&seed=1", "v2")
        assert first.memory is not None
        assert second.memory is not None
        assert second.kv is not None
        held = first.memory.weights_bytes + first.memory.fixed_bytes
        left = budget - held - second.memory.weights_bytes - second.kv.activation_bytes
        assert second.kv.num_blocks == int(left * 0.5) // BLOCK_BYTES
        with pytest.raises(ValueError, match=r"held by other loaded versions"):
            await runtime.load_version(f"{SYNTHETIC}&seed=2", "v3")


async def test_unbounded_budget_holds_running_sequences_full_contexts_capped() -> None:
    """Budget 0: max_running_sequences full contexts, capped by unbounded_kv_bytes."""
    async with serving(
        model=f"{SYNTHETIC}&context_length=64",
        generation={"max_running_sequences": 4, "unbounded_kv_bytes": 10**9},
    ) as runtime:
        roomy = await runtime.wait_ready()
    async with serving(
        model=f"{SYNTHETIC}&context_length=64",
        generation={"max_running_sequences": 4, "unbounded_kv_bytes": 6 * BLOCK_BYTES},
    ) as runtime:
        capped = await runtime.wait_ready()
    assert roomy.kv is not None
    assert capped.kv is not None
    assert roomy.kv.num_blocks == 4 * 64 // 16
    assert capped.kv.num_blocks == 6


async def test_context_limit_comes_from_the_model_or_max_context() -> None:
    """generation.max_context lowers the context the engine enforces (400 on the API)."""
    async with serving(generation={"max_context": 12}) as runtime:
        await runtime.wait_ready()
        assert runtime.generation_info().context_length == 12
        with pytest.raises(InputTooLong, match="12"):
            await runtime.generate(request("one two three four five", max_tokens=8))


async def test_swap_keeps_in_flight_streams_on_the_old_version() -> None:
    """New requests go to the new version; a stream already running ends on the old one.

    Even released, the old version's engine serves its stream to the end, then stops.
    """
    slow = "builtin://synthetic-generate?per_token_ms=20&output_tokens=12"
    async with serving(model=slow) as runtime:
        await runtime.wait_ready()
        old_text, _ = await collect(await runtime.generate(request("tell me")))
        in_flight = await runtime.generate(request("tell me"))
        first = await anext(aiter(in_flight))
        assert isinstance(first, TokenEvent)
        old_engine = runtime.model("v1").engine
        assert old_engine is not None
        await runtime.load_version(f"{slow}&seed=9", "v2")
        assert runtime.generation_info().version == "v2"
        assert runtime.release_previous() == "v1"
        assert runtime.versions() == ["v2"]
        new_text, _ = await collect(await runtime.generate(request("tell me")))
        rest, last = await collect(in_flight)
        assert isinstance(last, FinishEvent)
        assert first.text + rest == old_text
        assert new_text != old_text
        await until(lambda: not old_engine.is_running)


async def test_a_stream_submitted_just_before_its_version_is_released_still_finishes() -> None:
    """Released between `submit` and the stream's first step, the old engine still serves it.

    The engine only counts a request in its step statistics once a step took it in; the
    drain must wait for the stream itself, or it stops an engine with a stream in its inbox.
    """
    slow = "builtin://synthetic-generate?per_token_ms=20&output_tokens=12"
    async with serving(model=slow) as runtime:
        await runtime.wait_ready()
        await runtime.load_version(f"{slow}&seed=9", "v2")
        in_flight = await runtime.generate(request("tell me", version="v1"))
        assert runtime.release_previous() == "v1"
        text, last = await collect(in_flight)
    assert isinstance(last, FinishEvent), last
    assert len(text.split(" ")) == 12


async def test_infer_on_a_generative_model_names_the_generate_endpoints() -> None:
    """The encoder path refuses with 400, pointing at the generate endpoints."""
    async with serving() as runtime:
        await runtime.wait_ready()
        with pytest.raises(InvalidInput, match=r"/v1/chat/completions"):
            await runtime.infer(InferenceCall(["hello"]))


async def test_generate_on_an_encoder_says_it_serves_embeddings() -> None:
    """Generation on an encoder model is refused, naming the infer endpoint."""
    async with serving(model="builtin://synthetic?latency_ms=0&per_item_ms=0") as runtime:
        await runtime.wait_ready()
        assert not runtime.is_generative
        with pytest.raises(InvalidInput, match="serves embeddings, not generation"):
            await runtime.generate(request("hello"))
        with pytest.raises(InvalidInput, match="serves embeddings"):
            runtime.generation_info()


async def test_ready_only_after_a_warm_up_generation() -> None:
    """With warmup, one token went through the engine before the version became ready."""
    async with serving(warmup=True) as runtime:
        ready_while_loading = runtime.is_ready
        await runtime.wait_ready()
        assert not ready_while_loading
        assert runtime.is_ready
        labels = {"model": "test", "version": "v1", "track": "stable"}
        sample = runtime.metrics.registry.get_sample_value
        assert sample("fleetserve_generation_tokens_total", labels) == 1.0


SLOW = "builtin://synthetic-generate?per_token_ms=50&output_tokens=1000"


async def streaming_slowly() -> tuple[Runtime, GenerationStream]:
    """A ready runtime of a slow model (the test stops it) and a stream it has begun."""
    runtime = Runtime(make_config(model=SLOW))
    await runtime.start()
    await runtime.wait_ready()
    stream = await runtime.generate(request("keep going", max_tokens=1000))
    assert isinstance(await anext(aiter(stream)), TokenEvent)
    return runtime, stream


async def test_stop_ends_running_streams_with_an_error() -> None:
    """Shutting down fails what still streams; later requests get ModelNotReady."""
    runtime, stream = await streaming_slowly()
    await runtime.stop()
    _, last = await collect(stream)
    assert isinstance(last, ErrorEvent)
    with pytest.raises(ModelNotReady):
        await runtime.generate(request("again"))


async def test_stop_also_stops_a_released_version_still_draining() -> None:
    """A released version's engine, waiting for its last stream, stops with the runtime."""
    runtime, stream = await streaming_slowly()
    old_engine = runtime.model("v1").engine
    assert old_engine is not None
    await runtime.load_version(f"{SLOW}&seed=1", "v2")
    runtime.release_previous()
    await runtime.stop()
    _, last = await collect(stream)
    assert isinstance(last, ErrorEvent)
    assert not old_engine.is_running


HANG_BOUND_S = 30.0
"""Longest a trapped step waits for its release: a failing test must not hang the run."""
FLOOR_S = 0.5
"""A stuck-step floor far below how long the tests hold a step."""


class WorkerKilled(BaseException):
    """Escapes the engine's per-step error handling, as a bug in its loop itself would."""


@dataclass
class StepTrap:
    """Patched into `SyntheticLM.forward`: the next step, once armed, hangs or kills its thread."""

    armed: Literal["hang", "kill"] | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def spring(self) -> None:
        """Called at the start of every step: disarms, then hangs or kills when it was armed."""
        armed, self.armed = self.armed, None
        if armed is None:
            return
        self.entered.set()
        if armed == "kill":
            raise WorkerKilled
        self.release.wait(HANG_BOUND_S)

    async def wait_entered(self) -> None:
        """Until the armed step has sprung the trap."""
        assert await asyncio.to_thread(self.entered.wait, 10), "the trapped step never ran"


@pytest.fixture
def trap(monkeypatch: pytest.MonkeyPatch) -> Iterator[StepTrap]:
    """A `StepTrap` on every synthetic generative model; released at teardown at the latest."""
    step_trap = StepTrap()
    forward = SyntheticLM.forward

    def trapped(self: SyntheticLM, step: StepInput) -> torch.Tensor:
        step_trap.spring()
        return forward(self, step)

    monkeypatch.setattr(SyntheticLM, "forward", trapped)
    yield step_trap
    step_trap.release.set()


def stalled_gauge(runtime: Runtime) -> float | None:
    """`fleetserve_executor_stalled` as a scrape reads it."""
    labels = {"model": "test", "track": "stable"}
    return runtime.metrics.registry.get_sample_value("fleetserve_executor_stalled", labels)


@pytest.mark.parametrize("released", [False, True], ids=["active", "draining"])
async def test_a_hung_generation_step_fails_liveness_until_it_ends(
    trap: StepTrap, released: bool
) -> None:
    """A step past the stuck limit fails liveness and sets the stalled gauge, then heals.

    Also for a released version still draining its streams: its worker is watched as well.
    """
    slow = "builtin://synthetic-generate?per_token_ms=20&output_tokens=20"
    async with serving(model=slow, health={"stuck_batch_floor_s": FLOOR_S}) as runtime:
        await runtime.wait_ready()
        assert runtime.liveness() == Liveness(ok=True)
        assert stalled_gauge(runtime) == 0
        stream = await runtime.generate(request("hold a later step"))
        assert isinstance(await anext(aiter(stream)), TokenEvent)
        trap.armed = "hang"
        try:
            await trap.wait_entered()
            if released:
                await runtime.load_version(f"{slow}&seed=1", "v2")
                assert runtime.release_previous() == "v1"
            await until(lambda: not runtime.liveness().ok)
            verdict = runtime.liveness()
            stalled = (runtime.snapshot().executor_stalled, stalled_gauge(runtime))
        finally:
            trap.release.set()
        _, last = await collect(stream)
        await until(lambda: runtime.liveness().ok)
        after = (runtime.liveness(), runtime.snapshot().executor_stalled, stalled_gauge(runtime))
    assert re.fullmatch(
        r"generation engine of version 'v1' stuck: step running for [\d.]+s, "
        r"over its limit of 0\.5s \(expected [\d.]+ms\)",
        verdict.reason,
    ), verdict.reason
    assert stalled == (True, 1)
    assert isinstance(last, FinishEvent)
    assert after == (Liveness(ok=True), False, 0)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_dead_generation_worker_fails_liveness_and_readiness(trap: StepTrap) -> None:
    """A worker thread that ended on its own never serves again: not live, not ready."""
    async with serving() as runtime:
        await runtime.wait_ready()
        trap.armed = "kill"
        stream = await runtime.generate(request("the last words"))
        await trap.wait_entered()
        await until(lambda: not runtime.liveness().ok)
        verdict = runtime.liveness()
        assert runtime.snapshot().executor_stalled
        assert not runtime.is_ready
        with pytest.raises(ModelNotReady):
            await runtime.generate(request("anyone there"))
    assert verdict == Liveness(
        ok=False, reason="generation engine of version 'v1' dead: its worker thread ended"
    )
    with pytest.raises(ModelNotReady, match="shutting down"):
        await collect(stream)


async def test_smollm2_serves_the_capital_of_france(smollm2_checkpoint: Checkpoint) -> None:
    """builtin://smollm2-135m loads through the runtime and answers greedily with Paris.

    Its weights count in full (all fp32 parameters), also those the GGUF reader dequantised
    into numpy arrays that torch's allocator never saw.
    """
    parameters = sum(tensor.numel() for tensor in smollm2_checkpoint.weights.values())
    torch.set_num_threads(2)
    async with serving(
        model="builtin://smollm2-135m",
        generation={"max_context": 256, "max_step_tokens": 64, "unbounded_kv_bytes": 2**26},
    ) as runtime:
        loaded = await runtime.wait_ready()
        assert loaded.metadata.platform == "fleetserve-llama"
        assert loaded.memory is not None
        assert loaded.memory.weights_bytes >= 4 * parameters
        text, last = await collect(
            await runtime.generate(request("The capital of France is", max_tokens=6))
        )
    assert "Paris" in text
    assert isinstance(last, FinishEvent)


def test_generation_knobs_come_from_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `generation` section reaches the CLI and FLEETSERVE_GENERATION_* like the others."""
    monkeypatch.setenv("FLEETSERVE_GENERATION_MAX_RUNNING_SEQUENCES", "8")
    config = parse_config(
        ["--generation-block-size", "32", "--generation-policy", "static",
         "--no-generation-prefix-caching"]
    )  # fmt: skip
    generation = config.generation
    assert (generation.block_size, generation.policy) == (32, "static")
    assert generation.max_running_sequences == 8
    assert not generation.prefix_caching


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(
            ["--generation-max-step-tokens", "4", "--generation-max-running-sequences", "8"],
            "max_step_tokens \\(4\\) must be >= generation.max_running_sequences",
            id="step-below-running",
        ),
        pytest.param(["--generation-kv-cache-fraction", "0"], "kv_cache_fraction", id="fraction"),
        pytest.param(["--generation-policy", "eager"], "policy", id="policy"),
    ],
)
def test_bad_generation_knobs_are_refused_naming_them(flags: list[str], message: str) -> None:
    """Out-of-range values and bad combinations stop start-up with the field named."""
    with pytest.raises(ValidationError, match=message):
        parse_config(flags)


@pytest.mark.gpu
async def test_smollm2_on_cuda_runs_in_bf16(smollm2_checkpoint: Checkpoint) -> None:
    """On a GPU the weights and KV blocks are bf16 (two bytes each) and Paris still comes."""
    parameters = sum(tensor.numel() for tensor in smollm2_checkpoint.weights.values())
    async with serving(
        model="builtin://smollm2-135m",
        device="cuda",
        memory={"budget_bytes": 2 * 1024**3},
        generation={"max_context": 1024},
    ) as runtime:
        loaded = await runtime.wait_ready()
        assert loaded.memory is not None
        assert loaded.kv is not None
        assert 2 * parameters <= loaded.memory.weights_bytes < 3 * parameters
        assert loaded.kv.block_bytes == 2 * 30 * 3 * 64 * 2 * 16
        text, _ = await collect(
            await runtime.generate(request("The capital of France is", max_tokens=6))
        )
    assert "Paris" in text
