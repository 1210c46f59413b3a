"""Operator → runtime for generative models: engine flags, defaults, KV gauges, builtin figures.

The pod's `--generation-*` flags parse with the runtime's own parser into exactly the spec's
knobs; the CRD's defaults are the runtime's; the KV gauges the memory check queries are in
the runtime's registry; and the SmolLM2 and synthetic figures the spec's rules compute with
are the loaded models' own.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_operator import analysis, contract
from fleetserve_operator.naming import Track
from fleetserve_operator.render import plan_tracks
from fleetserve_operator.render.pods import TrackPlan, runtime_args
from fleetserve_operator.spec import GenerationSpec, InferenceServiceStatus
from fleetserve_operator.spec.model import (
    SMOLLM2_KV_BYTES_PER_TOKEN,
    SMOLLM2_MIN_WEIGHTS_BYTES,
    builtin_context_length,
)
from fleetserve_operator.testing import make_spec
from fleetserve_runtime.cli import config_flags, parse_config
from fleetserve_runtime.core.config_sections import GenerationConfig
from fleetserve_runtime.core.metrics import RuntimeMetrics, StateSnapshot
from fleetserve_runtime.models.registry import resolve_handler

SMOLLM2 = {"name": "chat", "version": "3", "uri": "builtin://smollm2-135m"}
SYNTHETIC = {"name": "chat", "version": "3", "uri": "builtin://synthetic-generate?vocab=64"}
SPECS = {
    "defaults": {"model": SMOLLM2},
    "tuned": {
        "model": SYNTHETIC,
        "generation": {"kvCacheFraction": 0.5, "blockSize": 32, "maxRunningSequences": 8,
                       "maxStepTokens": 64, "maxContext": 2048, "prefixCaching": False,
                       "defaultTimeoutMs": 1000, "maxTimeoutMs": 2000, "drainSeconds": 30,
                       "defaultMaxTokens": 64, "maxOutputTokens": 256, "allowIgnoreEos": True},
        "memory": {"budget": "2Gi"},
        "fallback": {"enabled": True, "generation": {"maxRunningSequences": 2,
                                                     "maxStepTokens": 16,
                                                     "maxOutputTokens": 128}},
    },
    "checkpoint": {"model": {"name": "llama", "version": "1", "uri": "pvc://w/llama.gguf",
                             "task": "generate"},
                   "fallback": {"enabled": True, "generation": {"prefixCaching": False}}},
}  # fmt: skip
KNOBS = [f for f in GenerationSpec.model_fields if f != "drain_seconds"]
"""The knobs the runtime reads; `drainSeconds` shapes the pod, not the process."""


def _plans(sections: dict[str, Any]) -> list[TrackPlan]:
    return plan_tracks(make_spec(**sections), InferenceServiceStatus())


@pytest.mark.parametrize("name", SPECS)
def test_generation_flags_round_trip(name: str) -> None:
    """Every track's flags parse into a `generation` section holding exactly its knobs."""
    plans = _plans(SPECS[name])
    for plan in plans:
        knobs = plan.generation
        assert knobs is not None
        config = parse_config(runtime_args(plan))
        for knob in KNOBS:
            assert getattr(config.generation, knob) == getattr(knobs, knob), (plan, knob)
    if name == "tuned":
        fallback = [p for p in plans if p.config.track is Track.FALLBACK][0]
        assert parse_config(runtime_args(fallback)).generation.max_running_sequences == 2
        assert parse_config(runtime_args(fallback)).generation.max_output_tokens == 128


@pytest.mark.parametrize("name", SPECS)
def test_every_generation_flag_is_a_runtime_flag(name: str) -> None:
    """No flag rendered for a generative track is unknown to the runtime."""
    known = {flag.flag for flag in config_flags()}
    known |= {f"--no-{flag.flag.removeprefix('--')}" for flag in config_flags()}
    for plan in _plans(SPECS[name]):
        rendered = {arg for arg in runtime_args(plan) if arg.startswith("--")}
        assert rendered <= known, rendered - known
        assert any(arg.startswith("--generation-") for arg in rendered)


def test_generation_defaults_agree() -> None:
    """The CRD's generation defaults are the runtime's."""
    spec, runtime = GenerationSpec(), GenerationConfig()
    for knob in KNOBS:
        assert getattr(spec, knob) == getattr(runtime, knob), knob


def test_the_kv_gauges_the_memory_check_queries_exist_with_their_labels() -> None:
    """`fleetserve_model_kv_cache_*` carry a version's pool figures, labelled as queried."""
    figures = {"weights_bytes": 5.0, "fixed_bytes": 9.0, "bytes_per_token": 0.0,
               "kv_cache_blocks": 12.0, "kv_cache_block_bytes": 4096.0}  # fmt: skip
    snapshot = StateSnapshot(0, 0, 0, 0, 0, 0, {"3": figures})
    metrics = RuntimeMetrics(model="chat", track=Track.STABLE.value, snapshot=lambda: snapshot)
    text = generate_latest(metrics.registry).decode()
    exposed = {
        sample.name: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    for metric, key in (
        (contract.KV_CACHE_BLOCKS_METRIC, "kv_cache_blocks"),
        (contract.KV_CACHE_BLOCK_BYTES_METRIC, "kv_cache_block_bytes"),
    ):
        query = analysis.memory_query(metric, namespace="ns", model="chat", version="3")
        assert f"{metric}{{" in query
        sample = exposed[metric]
        assert sample.value == figures[key]
        assert sample.labels == {"model": "chat", "version": "3", "track": "stable"}


def test_synthetic_generate_context_is_the_runtimes() -> None:
    """The operator's default and parsed synthetic contexts are what the runtime loads."""
    for uri in ("builtin://synthetic-generate", "builtin://synthetic-generate?context_length=96"):
        handler = resolve_handler(uri, name="m", version="1", max_sequence_length=32)
        handler.load(torch.device("cpu"))
        expected = builtin_context_length(make_spec(model={**SYNTHETIC, "uri": uri}).model)
        assert handler.context_length == expected


def test_smollm2_floor_is_below_what_the_model_takes() -> None:
    """The CEL floor (bf16 KV bytes per token, 256Mi of weights, 8192 tokens) is SmolLM2's.

    Loaded on CPU in fp32: half its KV bytes per token are exactly the floor's, half its
    weights are above 256Mi, and its context is 8192 tokens.
    """
    handler = resolve_handler(SMOLLM2["uri"], name="m", version="1", max_sequence_length=32)
    handler.load(torch.device("cpu"))
    layout = handler.lm.kv_layout
    assert layout.dtype_bytes == 4
    assert layout.block_bytes(1) // 2 == SMOLLM2_KV_BYTES_PER_TOKEN
    assert handler.weights_bytes() // 2 >= SMOLLM2_MIN_WEIGHTS_BYTES
    assert handler.context_length == builtin_context_length(make_spec(model=SMOLLM2).model)
