"""Generative InferenceServices: the task, the engine's knobs, routes, drain and memory check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import InvalidSpec
from fleetserve_operator.naming import Track
from fleetserve_operator.observe import memory_problem
from fleetserve_operator.records import Manifest, MemoryFigures
from fleetserve_operator.render import (
    Owner,
    check_semantics,
    desired_children,
    plan_tracks,
)
from fleetserve_operator.render.pods import DRAIN_SECONDS, SHUTDOWN_SECONDS
from fleetserve_operator.spec import (
    ConditionType,
    GenerationSpec,
    InferenceServiceSpec,
    InferenceServiceStatus,
)
from fleetserve_operator.testing import FakeKube, FakeMetricSource, make_service, make_spec

INVALID = Path(__file__).resolve().parents[1] / "invalid"
OWNER = Owner(name="chat", namespace="ns", uid="uid")
SMOLLM2 = {"name": "chat", "version": "1", "uri": "builtin://smollm2-135m"}
SYNTHETIC = {"name": "chat", "version": "1", "uri": "builtin://synthetic-generate?per_token_ms=1"}
GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}], "hostnames": ["chat.x"]}
MIB = 2**20


def _spec(model: dict[str, Any] = SMOLLM2, **sections: Any) -> InferenceServiceSpec:
    return make_spec(model=model, **sections)


def _kinds(children: list[Manifest], kind: str) -> dict[str, Manifest]:
    return {c["metadata"]["name"]: c for c in children if c["kind"] == kind}


def _flags(args: list[str]) -> dict[str, str]:
    return dict(zip(args, args[1:], strict=False))


# -- the task ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "task"),
    [
        pytest.param(SMOLLM2, "generate", id="smollm2"),
        pytest.param(SYNTHETIC, "generate", id="synthetic-generate"),
        pytest.param({**SMOLLM2, "uri": "builtin://minilm-l6"}, "embed", id="minilm"),
        pytest.param({**SMOLLM2, "uri": "builtin://synthetic?latency_ms=1"}, "embed",
                     id="synthetic"),
        pytest.param({**SMOLLM2, "uri": "file:///models/llama.gguf"}, "embed", id="file-unset"),
        pytest.param({**SMOLLM2, "uri": "pvc://w/llama", "task": "generate"}, "generate",
                     id="pvc-declared"),
    ],
)  # fmt: skip
def test_the_task_is_declared_or_known_from_the_builtin(model: dict[str, Any], task: str) -> None:
    """Unset: a builtin's own task, else embed; a checkpoint says `generate` itself."""
    assert _spec(model).model.effective_task == task
    assert _spec(model).model.generates is (task == "generate")


INVALID_GENERATIVE = [
    "generation-on-encoder",
    "fallback-generation-on-encoder",
    "task-contradicts-builtin",
    "task-generate-on-encoder-builtin",
    "step-tokens-below-running-sequences",
    "generation-timeouts-inverted",
    "max-context-below-block-size",
    "generative-gateway-without-hostnames",
    "smollm2-context-over-budget",
]


@pytest.mark.parametrize("name", INVALID_GENERATIVE)
def test_the_operator_refuses_what_the_api_server_refuses_with_the_same_words(name: str) -> None:
    """Each impossible combination fails pydantic with the CEL rule's message.

    The files are tests/operator/invalid/'s: e2e/operator_e2e/test_crd.py applies them to a
    real API server and expects the same message.
    """
    text = (INVALID / f"{name}.yaml").read_text()
    message = next(line for line in text.splitlines() if line.startswith("# message: "))
    with pytest.raises(ValidationError) as refused:
        InferenceServiceSpec.model_validate(yaml.safe_load(text)["spec"])
    assert message.removeprefix("# message: ") in str(refused.value)


def _budget_for(context: int, *, reserve: float = 0.1, fraction: float = 1.0) -> int:
    """The smallest budget whose bf16 pool holds one `context`-token SmolLM2 sequence."""
    need = -(-context // 16) * 16 * 23_040
    return int(-(-(need / fraction + 256 * MIB) // (1 - reserve)))


@pytest.mark.parametrize("context", [512, 4096])
def test_the_smollm2_context_must_fit_the_budget_to_the_byte(context: int) -> None:
    """One byte below the smallest budget that holds one context is refused, naming both."""
    fits = _budget_for(context)
    generation = {"maxContext": context}
    assert _spec(memory={"budget": fits}, generation=generation).memory.budget_bytes == fits
    with pytest.raises(ValidationError, match=r"memory\.budget \(\d+\) cannot hold one"):
        _spec(memory={"budget": fits - 1}, generation=generation)


def test_the_model_context_counts_when_max_context_is_unset() -> None:
    """An unset maxContext is the model's 8192 tokens; kvCacheFraction shrinks the pool."""
    assert _spec(memory={"budget": _budget_for(8192)}).model.generates
    with pytest.raises(ValidationError, match="8192 tokens"):
        _spec(memory={"budget": _budget_for(8192) - 1})
    with pytest.raises(ValidationError, match="cannot hold one"):
        _spec(memory={"budget": _budget_for(8192)}, generation={"kvCacheFraction": 0.9})


def test_an_encoder_spec_is_unchanged() -> None:
    """No generation section: encoders keep their digest, routes and flags."""
    spec = make_spec()
    assert spec.gpu_track.generation_knobs is None
    assert "generation" not in spec.gpu_track.model_dump(exclude_defaults=True)
    plan = plan_tracks(spec, InferenceServiceStatus())[0]
    assert plan.generation is None
    assert not [arg for arg in _deployment_args(spec, "demo-stable") if "generation" in arg]


# -- flags, drain, fallback ----------------------------------------------------------------


def _deployments(spec: InferenceServiceSpec) -> dict[str, Manifest]:
    return _kinds(desired_children(OWNER, spec, InferenceServiceStatus()), "Deployment")


def _deployment_args(spec: InferenceServiceSpec, name: str) -> list[str]:
    owner = Owner(name=name.rsplit("-", 1)[0], namespace="ns", uid="uid")
    children = desired_children(owner, spec, InferenceServiceStatus())
    deployment = _kinds(children, "Deployment")[name]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_the_fallback_runs_its_own_generation_overrides() -> None:
    """GPU tracks get spec.generation; the CPU fallback the same with its overrides on top."""
    spec = _spec(
        generation={"maxRunningSequences": 48, "maxStepTokens": 1024, "prefixCaching": False},
        fallback={"enabled": True, "generation": {"maxRunningSequences": 4}},
    )
    stable_args = _deployment_args(spec, "chat-stable")
    fallback_args = _deployment_args(spec, "chat-fallback")
    stable, fallback = _flags(stable_args), _flags(fallback_args)
    assert stable["--generation-max-running-sequences"] == "48"
    assert fallback["--generation-max-running-sequences"] == "4"
    assert stable["--generation-max-step-tokens"] == fallback["--generation-max-step-tokens"]
    for args in (stable_args, fallback_args):
        assert "--no-generation-prefix-caching" in args


def test_a_fallback_override_that_breaks_a_rule_names_its_field() -> None:
    """A maxRunningSequences above the inherited maxStepTokens is the fallback's error."""
    spec = _spec(fallback={"enabled": True, "generation": {"maxRunningSequences": 1024}})
    with pytest.raises(InvalidSpec) as caught:
        check_semantics(OWNER, spec)
    assert caught.value.field == "spec.fallback.generation"
    assert "maxStepTokens (512)" in str(caught.value)


@pytest.mark.parametrize(
    ("model", "generation", "drain"),
    [
        pytest.param(SMOLLM2, None, 120, id="generative-default"),
        pytest.param(SMOLLM2, {"drainSeconds": 600}, 600, id="generative-long"),
        pytest.param(SMOLLM2, {"drainSeconds": 0}, DRAIN_SECONDS, id="generative-floor"),
        pytest.param({**SMOLLM2, "uri": "builtin://minilm-l6"}, None, DRAIN_SECONDS,
                     id="encoder"),
    ],
)  # fmt: skip
def test_terminating_pods_keep_streaming_for_the_drain(
    model: dict[str, Any], generation: dict[str, Any] | None, drain: int
) -> None:
    """The preStop sleep is `drainSeconds` (new requests go elsewhere), within the grace."""
    sections = {} if generation is None else {"generation": generation}
    spec = _spec(model, fallback={"enabled": True}, **sections)
    for deployment in _deployments(spec).values():
        pod = deployment["spec"]["template"]["spec"]
        pre_stop = pod["containers"][0]["lifecycle"]["preStop"]
        assert pre_stop == {"sleep": {"seconds": drain}}
        assert pod["terminationGracePeriodSeconds"] == drain + SHUTDOWN_SECONDS


# -- routes -----------------------------------------------------------------------------


def _route(spec: InferenceServiceSpec) -> Manifest:
    route: Manifest = _kinds(desired_children(OWNER, spec, InferenceServiceStatus()), "HTTPRoute")[
        "chat"
    ]
    return route


def test_a_generative_route_exposes_only_its_models_generation_paths() -> None:
    """OpenAI chat, completions and models, and the model's own OIP generate paths, exact."""
    route = _route(_spec(traffic=GATEWAY))
    matches = route["spec"]["rules"][0]["matches"]
    assert [(m["path"]["type"], m["path"]["value"]) for m in matches] == [
        ("Exact", "/v1/chat/completions"),
        ("Exact", "/v1/completions"),
        ("Exact", "/v1/models"),
        ("Exact", "/v1/models/chat"),
        ("Exact", "/v2/models/chat/generate"),
        ("Exact", "/v2/models/chat/generate_stream"),
    ]
    assert route["spec"]["hostnames"] == ["chat.x"]


def test_an_encoder_route_keeps_the_inference_prefixes() -> None:
    """An encoder's HTTPRoute is what it was: the model's infer and predict prefixes."""
    route = _route(make_spec(model={**SMOLLM2, "uri": "builtin://minilm-l6"}, traffic=GATEWAY))
    matches = route["spec"]["rules"][0]["matches"]
    assert [(m["path"]["type"], m["path"]["value"]) for m in matches] == [
        ("PathPrefix", "/v2/models/chat"),
        ("PathPrefix", "/v1/models/chat:predict"),
    ]


# -- memory check -----------------------------------------------------------------------

# What a SmolLM2 replica on CPU measured with a 1536Mi budget, 512-token steps and a 4096-token
# context: 930 blocks of 16 tokens.
WEIGHTS = 542_254_336.0
ACTIVATIONS = 221_262_088.0
BLOCK_BYTES = 737_280.0
BLOCKS = 930.0


def _figures(blocks: float | None = BLOCKS) -> MemoryFigures:
    pool = (blocks or 0) * BLOCK_BYTES
    return MemoryFigures(
        weights_bytes=WEIGHTS,
        fixed_bytes=ACTIVATIONS + pool,
        bytes_per_token=0.0,
        kv_cache_blocks=blocks,
        kv_cache_block_bytes=None if blocks is None else BLOCK_BYTES,
    )


def _smallest_budget(context: int, step_scale: float = 1.0) -> int:
    need = WEIGHTS + ACTIVATIONS * step_scale + -(-context // 16) * BLOCK_BYTES
    return int(-(-need // 0.9))


def test_memory_check_passes_where_one_context_fits() -> None:
    """Weights + one step + one full context within budget x (1 - reserve): no problem."""
    budget = _smallest_budget(8192)
    assert memory_problem(_spec(memory={"budget": budget}), _figures()) is None


def test_memory_check_names_the_shortfall_of_a_pool_below_one_context() -> None:
    """A budget a few MiB short: MemoryBudgetExceeded with every figure and the bytes short."""
    budget = _smallest_budget(8192) - 4 * MIB
    problem = memory_problem(_spec(memory={"budget": budget}), _figures())
    assert problem is not None
    assert problem.reason == "MemoryBudgetExceeded"
    message = problem.message
    assert f"weights {int(WEIGHTS)}" in message
    assert "the KV cache of one 8192-token sequence 377487360" in message
    assert "spec.memory.budget" in message
    short = int(message.split(" bytes more than")[0].rsplit(" ", 1)[1])
    assert 0.9 * 4 * MIB - 2 <= short <= 0.9 * 4 * MIB + 2


def test_memory_check_scales_the_measurement_to_the_specs_knobs() -> None:
    """Figures measured with 512-token steps and 16-token blocks, judged for the spec's own."""
    measured = GenerationSpec()
    generation = {"maxStepTokens": 2048, "blockSize": 32, "maxContext": 1000}
    budget = _smallest_budget(1024, step_scale=4.0)
    fits = _spec(memory={"budget": budget}, generation=generation)
    assert memory_problem(fits, _figures(), measured) is None
    short = _spec(memory={"budget": budget - 2 * MIB}, generation=generation)
    problem = memory_problem(short, _figures(), measured)
    assert problem is not None
    assert "maxStepTokens 2048-token step 885048352" in problem.message
    assert "one 1000-token sequence 47185920" in problem.message


def test_memory_check_waits_for_the_kv_figures() -> None:
    """A generative replica that has not reported its pool is not judged."""
    budget = _smallest_budget(8192) - 64 * MIB
    assert memory_problem(_spec(memory={"budget": budget}), _figures()) is not None
    assert memory_problem(_spec(memory={"budget": budget}), _figures(None)) is None


def test_the_memory_check_reports_the_shortfall_in_status() -> None:
    """From Prometheus to status: the KV gauges of the stable version, Degraded naming it."""
    budget = _smallest_budget(8192) - 64 * MIB
    source = FakeMetricSource({
        "fleetserve_model_weights_bytes": WEIGHTS,
        "fleetserve_model_fixed_bytes": ACTIVATIONS + BLOCKS * BLOCK_BYTES,
        "fleetserve_model_bytes_per_token": 0.0,
        "fleetserve_model_kv_cache_blocks": BLOCKS,
        "fleetserve_model_kv_cache_block_bytes": BLOCK_BYTES,
    })  # fmt: skip
    kube = FakeKube()
    kube.add_service(make_service({"model": SMOLLM2, "memory": {"budget": budget}}))
    sync = Sync(
        kube,
        metrics=OperatorMetrics(),
        default_prometheus_url="http://prom:9090",
        metric_source=lambda url: source,
    )
    sync.run_by_name("ns", "demo", trigger="create")
    status = kube.status_of("ns", "demo")
    degraded = status.condition(ConditionType.DEGRADED)
    assert degraded is not None
    assert (degraded.status, degraded.reason) == ("True", "MemoryBudgetExceeded")
    assert "8192-token sequence" in degraded.message
    selector = f'namespace="ns",model="chat",version="1",track="{Track.STABLE}"'
    kv_queries = [q for q in source.queries if "kv_cache" in q]
    assert len(kv_queries) == 2
    assert all(selector in q for q in kv_queries)
