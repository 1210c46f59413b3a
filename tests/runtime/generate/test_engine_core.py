"""The engine core's steps: outputs that no scheduling regime may change, failures, pace.

Continuous batching, preemption and prefix reuse must give the outputs of one request at a
time (over `PagedEcho`, and over SmolLM2); a failing step fails its sequences only; the
metrics and the liveness view follow the steps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import torch
from prometheus_client import CollectorRegistry

from fleetserve_runtime.core.errors import BatchFailed
from fleetserve_runtime.generate.contracts import GenerationRequest, SamplingParams
from fleetserve_runtime.generate.engine import GenerationEngine
from fleetserve_runtime.generate.engine_core import StepPace
from fleetserve_runtime.generate.limits import EngineLimits
from fleetserve_runtime.generate.metrics import GenerationMetrics
from fleetserve_runtime.models.causal_lm import TextCodec
from fleetserve_runtime.models.llama.config import Checkpoint
from fleetserve_runtime.models.llama.model import LlamaModel
from fleetserve_runtime.testing import until
from tests.runtime.generate.engine_fakes import (
    PROMPTS,
    SYSTEM,
    PagedEcho,
    collect,
    make_engine,
    one_at_a_time,
    request,
    run_all,
    running_engine,
    texts,
)


async def test_continuous_batching_gives_the_outputs_of_one_at_a_time() -> None:
    """Sequences joining and leaving a busy batch, prefill in chunks: same tokens as batch 1."""
    reference = await one_at_a_time()
    lm = PagedEcho()
    # Eight requests, four at a time: the later ones join as the first ones finish.
    engine = make_engine(lm, max_step_tokens=16, max_running_sequences=4)
    results = await run_all(engine)
    assert texts(results) == texts(reference)
    assert all(len(r.text) == m for r, (_, m) in zip(reference, PROMPTS, strict=True))
    # The batch was shared: steps with several sequences, some mixing prefill and decode.
    assert max(len(step) for step in lm.steps) == 4
    assert any(any(n > 1 for _, n in step) and any(n == 1 for _, n in step) for step in lm.steps)
    assert all(sum(n for _, n in step) <= 16 for step in lm.steps)


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["plain", "prefix-caching"])
async def test_a_tiny_block_pool_preempts_without_changing_outputs(prefix_caching: bool) -> None:
    """Blocks for barely more than the longest sequence: preemption happens, outputs hold.

    With prefix caching, preemption and prefix reuse together (cached blocks evicted under
    pressure); every block is free again at the end, cached ones included.
    """
    reference = await one_at_a_time()
    engine = make_engine(num_blocks=36, prefix_caching=prefix_caching)
    results = await run_all(engine)
    assert engine.stats().preemptions > 0
    assert texts(results) == texts(reference)
    assert engine.stats().free_blocks == 36


async def test_prefix_caching_reuses_blocks_without_changing_outputs() -> None:
    """Prompts sharing a system prefix reuse its blocks; outputs equal those without caching."""
    reference = await one_at_a_time()
    engine = make_engine(num_blocks=64, prefix_caching=True)
    first = await collect(await engine.submit(request(*PROMPTS[0])))
    rest = await run_all(engine)
    stats = engine.stats()
    assert stats.prefix_cache_hit_tokens > 0
    assert texts([first]) == texts(reference[:1])
    assert texts(rest) == texts(reference)
    cached = [r.finish.usage.cached_tokens for r in rest]
    assert all(cached[n] >= len(SYSTEM) - 4 for n in (0, 2, 4, 6))
    assert cached[1] == cached[3] == 0


async def test_a_seed_reproduces_the_output_in_any_batch() -> None:
    """Temperature > 0 with a seed: same text alone and inside a batch of other requests."""
    seeded = request("tell me", 20, temperature=0.9, seed=1234)
    async with running_engine() as engine:
        alone = await collect(await engine.submit(seeded))
        crowd = [request(f"noise {n}", 15, temperature=1.1) for n in range(5)]
        streams = [await engine.submit(r) for r in crowd[:3]]
        streams.append(await engine.submit(seeded))
        streams.extend([await engine.submit(r) for r in crowd[3:]])
        together = await asyncio.gather(*(collect(s) for s in streams))
        other_seed = await collect(
            await engine.submit(request("tell me", 20, temperature=0.9, seed=99))
        )
    assert together[3].text == alone.text
    assert other_seed.text != alone.text


async def test_a_failing_step_fails_its_sequences_not_the_engine() -> None:
    """A forward that raises fails the sequences of that step; the engine serves the next."""
    poison = ord("!")
    lm = PagedEcho(fail_when=lambda step: any(poison in c.token_ids for c in step.chunks))
    async with running_engine(lm) as engine:
        with pytest.raises(BatchFailed, match="error id"):
            await collect(await engine.submit(request("boom!", 5)))
        fine = await collect(await engine.submit(request("fine", 5)))
        assert len(fine.text) == 5
        assert engine.stats().free_blocks == 512


async def test_metrics_count_tokens_latencies_and_cache_use() -> None:
    """Token counters, TTFT / ITL histograms, preemptions and prefix-cache counters move."""
    registry = CollectorRegistry()
    engine = make_engine(registry=registry, num_blocks=36, prefix_caching=True)
    results = await run_all(engine)
    labels = {"model": "m", "version": "v1", "track": "stable"}

    def value(name: str) -> float:
        sample = registry.get_sample_value(name, labels)
        assert sample is not None, name
        return sample

    generated = sum(r.finish.usage.completion_tokens for r in results)
    prompts = sum(r.finish.usage.prompt_tokens for r in results)
    assert value("fleetserve_generation_tokens_total") == generated
    assert value("fleetserve_prompt_tokens_total") == prompts
    assert value("fleetserve_time_to_first_token_seconds_count") == len(PROMPTS)
    assert value("fleetserve_inter_token_latency_seconds_count") == generated - len(PROMPTS)
    assert value("fleetserve_preemptions_total") == engine.stats().preemptions > 0
    # Each prompt is looked up once as a prompt; preempted sequences' re-admissions apart.
    assert value("fleetserve_prefix_cache_queries_total") == prompts
    assert value("fleetserve_prefix_cache_hits_total") == engine.stats().prefix_cache_hit_tokens
    assert value("fleetserve_prefix_cache_resumed_queries_total") > 0
    resumed_hits = engine.stats().prefix_cache_resumed_hit_tokens
    assert value("fleetserve_prefix_cache_resumed_hits_total") == resumed_hits
    assert value("fleetserve_running_sequences") == 0
    assert value("fleetserve_kv_cache_usage_ratio") == 0


def test_the_step_pace_expects_the_larger_of_a_mean_step_and_its_tokens_at_the_mean_rate() -> None:
    """No expectation before a step; then neither a lone decode nor a long prefill looks stuck."""
    pace = StepPace(alpha=0.5)
    assert pace.expected_s(100) is None
    pace.update(0.1, 100)
    assert pace.expected_s(1) == pytest.approx(0.1)
    assert pace.expected_s(300) == pytest.approx(0.3)
    pace.update(0.02, 1)
    assert pace.expected_s(1) == pytest.approx(0.06)
    assert pace.expected_s(1000) == pytest.approx((0.001 + 0.02) / 2 * 1000)


async def test_the_running_step_is_exposed_with_its_expected_time_for_liveness() -> None:
    """While the worker is in a step, `running_step` gives its start; once paced, its pace."""
    lm = PagedEcho(gate=threading.Event())
    async with running_engine(lm) as engine:
        assert engine.running_step() is None
        before = time.perf_counter()
        first = await engine.submit(request("first", 4))
        assert await asyncio.to_thread(lm.in_step.wait, 10)
        unmeasured = engine.running_step()
        assert unmeasured is not None
        assert before <= unmeasured.started <= time.perf_counter()
        assert unmeasured.expected_s is None
        assert lm.gate is not None
        lm.gate.set()
        await collect(first)
        await until(lambda: engine.running_step() is None)
        lm.gate = threading.Event()
        lm.in_step.clear()
        second = await engine.submit(request("second", 4))
        assert await asyncio.to_thread(lm.in_step.wait, 10)
        paced = engine.running_step()
        assert paced is not None
        assert paced.started > unmeasured.started
        assert paced.expected_s is not None
        assert paced.expected_s > 0
        lm.gate.set()
        await collect(second)
        await until(lambda: engine.running_step() is None)


OUTPUT_TOKENS = 40
SMOLLM2_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived",
    "List three colours of the rainbow:",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_checkpoint: Checkpoint) -> Iterator[tuple[LlamaModel, TextCodec]]:
    """SmolLM2 as our own LlamaModel (fp32, CPU), built once for this module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    checkpoint = smollm2_checkpoint
    model = LlamaModel(
        checkpoint.config, checkpoint.weights, device=torch.device("cpu"), dtype=torch.float32
    )
    yield model, checkpoint.codec
    torch.set_num_threads(threads)


async def smollm2_greedy(
    smollm2: tuple[LlamaModel, TextCodec], **limits: object
) -> tuple[list[list[int]], GenerationEngine]:
    model, codec = smollm2
    settings: dict[str, object] = {"block_size": 16, "max_step_tokens": 64, **limits}
    engine = GenerationEngine(
        lm=model,
        codec=codec,
        limits=EngineLimits(**settings),  # type: ignore[arg-type]
        metrics=GenerationMetrics(CollectorRegistry(), model="smollm2", track="stable"),
        context_length=2048,
    )
    engine.start()
    # Long enough that the four overlap and outgrow a tiny pool however their arrivals
    # interleave with the worker's steps (the tokenizer lets the worker run meanwhile).
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
    try:
        streams = [
            await engine.submit(GenerationRequest(sampling=params, prompt=p))
            for p in SMOLLM2_PROMPTS
        ]
        results = await asyncio.gather(*(collect(s) for s in streams))
    finally:
        await engine.stop()
    return [r.token_ids for r in results], engine


async def test_smollm2_greedy_is_the_same_under_preemption_and_at_batch_1(
    smollm2: tuple[LlamaModel, TextCodec],
) -> None:
    """SmolLM2 through the engine: a tiny block pool (preempting) = a large pool = batch 1."""
    batch1, _ = await smollm2_greedy(smollm2, num_blocks=64, max_running_sequences=1)
    large, _ = await smollm2_greedy(smollm2, num_blocks=64, max_running_sequences=4)
    tiny, engine = await smollm2_greedy(
        smollm2, num_blocks=6, max_running_sequences=4, prefix_caching=False
    )
    assert engine.stats().preemptions > 0
    assert large == batch1
    assert tiny == batch1
    assert all(len(ids) == OUTPUT_TOKENS for ids in batch1)
