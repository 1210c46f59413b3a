"""Operator → runtime: rendered flags parse with the runtime's own parser; metric names exist."""

from __future__ import annotations

import json
import math
import re
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_operator import analysis, contract, render
from fleetserve_operator.naming import Track
from fleetserve_operator.render import plan_tracks
from fleetserve_operator.spec import InferenceServiceStatus
from fleetserve_operator.testing import FakeMetricSource, make_spec
from fleetserve_runtime.cli import config_flags, parse_config
from fleetserve_runtime.core.metrics import LATENCY_BUCKETS_S, RuntimeMetrics, StateSnapshot
from fleetserve_runtime.core.shadow_target import ShadowTarget, read_target
from fleetserve_runtime.core.tenants import TENANT_HEADER
from fleetserve_runtime.generate.metrics import GenerationMetrics
from fleetserve_runtime.models.registry import resolve_handler

SPECS = {
    "defaults": {},
    "tuned": {
        "batching": {"maxBatchSize": 64, "maxQueueDelayMs": 2.5, "maxSequenceLength": 512,
                     "buckets": "16,64,512", "maxBatchTokens": 8192, "maxQueueSize": 32,
                     "defaultTimeoutMs": 100, "maxTimeoutMs": 900},
        "memory": {"budget": "12Gi", "reserveFraction": 0.2},
        "runtime": {"device": "cuda", "threads": 8},
        "fallback": {"enabled": True, "threads": 2, "batching": {"maxBatchSize": 4}},
    },
    "pvc": {"model": {"name": "enc", "version": "2024.1_b", "uri": "pvc://w/enc/v1"}},
    "fetched": {"model": {"name": "enc", "version": "3", "uri": "s3://models/enc/3",
                          "digest": "sha256:" + "d" * 64,
                          "metadata": {"dataVersion": "2026-11", "lr": "2e-5,warmup=100"}},
                "fallback": {"enabled": True}},
    "auth": {"runtime": {"authSecretRef": {"name": "tokens", "key": "current"}},
             "fallback": {"enabled": True}},
    "tls-and-priority": {"runtime": {"tls": {"secretName": "demo-cert"},
                                     "priorityTokenSecretRef": {"name": "tokens", "key": "vip"}},
                         "fallback": {"enabled": True}},
    "tenants": {"runtime": {"tenants": {"secretRef": {"name": "callers", "key": "table"},
                                        "trustHeader": True}},
                "fallback": {"enabled": True}},
}  # fmt: skip
TABLE = {"tenants": [{"name": "search", "tokens": [secrets.token_hex(16)]}]}


def _plans(sections: dict[str, Any]) -> list[tuple[Any, Any]]:
    spec = make_spec(**sections)
    return [(spec, plan) for plan in plan_tracks(spec, InferenceServiceStatus())]


def _as_mounted(args: list[str], token_file: Path, table_file: Path) -> list[str]:
    """`args` with the Secrets' files where the kubelet would mount them.

    The token files at `token_file`, the tenants table at `table_file`.
    """
    tokens = (contract.AUTH_TOKEN_FILE, contract.PRIORITY_TOKEN_FILE)
    mounted = [str(token_file) if arg in tokens else arg for arg in args]
    return [str(table_file) if arg == contract.TENANTS_FILE else arg for arg in mounted]


@pytest.mark.parametrize("name", SPECS)
def test_rendered_args_round_trip(name: str, tmp_path: Path) -> None:
    """Every track's flags parse into a RuntimeConfig holding exactly the spec's values.

    With `runtime.authSecretRef` (and `priorityTokenSecretRef`) every track's runtime reads
    its token from the file the Secret is mounted as (the runtime refuses to start on an
    unreadable one); without it, none does. With `runtime.tls` every track serves TLS with
    the mounted certificate and key.
    """
    token_file = tmp_path / "token"
    # As `openssl rand -hex 32` makes one: the runtime refuses short, guessable tokens.
    token_file.write_text(secrets.token_hex(32) + "\n")
    table_file = tmp_path / "tenants.yaml"
    table_file.write_text(json.dumps(TABLE))
    for spec, plan in _plans(SPECS[name]):
        args = contract.render_args(pods=plan.pods, config=plan.config)
        config = parse_config(_as_mounted(args, token_file, table_file))
        batching = plan.config.batching
        assert config.model == contract.runtime_model_uri(spec.model)
        assert (config.name, config.version) == (spec.model.name, spec.model.version)
        assert config.track == plan.config.track.value
        assert (config.device, config.threads) == (plan.config.device, plan.config.threads)
        assert config.batching.max_batch_size == batching.max_batch_size
        assert config.batching.max_queue_delay_ms == batching.max_queue_delay_ms
        assert config.batching.max_sequence_length == batching.max_sequence_length
        assert config.batching.max_batch_tokens == batching.max_batch_tokens
        expected_buckets = batching.bucket_edges or batching.buckets
        assert config.batching.buckets == expected_buckets
        assert config.queue.max_queue_size == batching.max_queue_size
        assert config.queue.default_timeout_ms == batching.default_timeout_ms
        assert config.queue.max_timeout_ms == batching.max_timeout_ms
        assert config.memory.budget_bytes == spec.memory.budget_bytes
        assert config.memory.reserve_fraction == spec.memory.reserve_fraction
        assert config.port == contract.HTTP_PORT
        auth = spec.runtime.auth_secret_ref
        assert config.auth_token_file == (None if auth is None else token_file)
        rendered = contract.AUTH_TOKEN_FILE if auth else None
        assert dict(zip(args, args[1:], strict=False)).get("--auth-token-file") == rendered
        priority = spec.runtime.priority_token_secret_ref
        assert config.priority_token_file == (None if priority is None else token_file)
        tls = spec.runtime.tls is not None
        assert config.tls_cert_file == (Path(contract.TLS_CERT_FILE) if tls else None)
        assert config.tls_key_file == (Path(contract.TLS_KEY_FILE) if tls else None)
        fetched = spec.model.uri is not None and spec.model.uri.startswith("s3://")
        assert config.model_source == (spec.model.uri if fetched else None)
        assert config.model_digest == spec.model.digest
        assert config.task == (spec.model.effective_task if fetched else "auto")
        assert config.model_metadata == spec.model.metadata
        tenants = spec.runtime.tenants
        assert config.tenants.file == (None if tenants is None else table_file)
        assert config.tenants.trust_header == (tenants is not None and tenants.trust_header)


@pytest.mark.parametrize("name", SPECS)
def test_every_rendered_flag_is_a_runtime_flag(name: str) -> None:
    """No flag the operator renders is unknown to the runtime (`--auth-token-file` too)."""
    known = {flag.flag for flag in config_flags()}
    for _, plan in _plans(SPECS[name]):
        args = contract.render_args(pods=plan.pods, config=plan.config)
        assert {a for a in args if a.startswith("--")} <= known


def test_the_tenant_header_is_the_runtimes() -> None:
    """The header the HTTPRoute strips is the one the runtime reads (HTTP names ignore case)."""
    assert contract.TENANT_HEADER.lower() == TENANT_HEADER


def test_batching_defaults_agree() -> None:
    """The CRD's batching defaults are the runtime's defaults."""
    spec, plan = _plans({})[0]
    config = parse_config(["--model", "builtin://synthetic"])
    assert config.batching.max_batch_size == spec.batching.max_batch_size
    assert config.batching.max_sequence_length == spec.batching.max_sequence_length
    assert config.queue.max_queue_size == spec.batching.max_queue_size
    assert config.queue.max_timeout_ms == spec.batching.max_timeout_ms
    assert config.memory.reserve_fraction == spec.memory.reserve_fraction


def _runtime_samples() -> list[Any]:
    """Every sample a runtime serving version 1 exports, the generative engine's included."""
    snapshot = StateSnapshot(0, 0, 0, 0, 0, 0, {"1": {
        "weights_bytes": 1.0, "fixed_bytes": 1.0, "bytes_per_token": 1.0}})  # fmt: skip
    metrics = RuntimeMetrics(model="m", track=Track.STABLE.value, snapshot=lambda: snapshot)
    metrics.observe_request("1", 200, 0.01)
    metrics.observe_batch("1", size=1, real_tokens=1, padded_tokens=1, queue_waits=[0.0],
                          compute_s=0.01)  # fmt: skip
    GenerationMetrics(metrics.registry, model="m", track=Track.STABLE.value).for_version("1")
    text = generate_latest(metrics.registry).decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _exposed_metrics() -> dict[str, set[str]]:
    exposed: dict[str, set[str]] = {}
    for sample in _runtime_samples():
        exposed.setdefault(sample.name, set()).update(sample.labels)
    return exposed


def _rendered_queries() -> list[str]:
    """Every PromQL query the operator sends: analysis, memory check and fallback trigger."""
    source = FakeMetricSource({"": 1000.0})  # every query answers, so every check runs
    spec = make_spec(rollout={"analysis": {"prometheusUrl": "http://p:9090",
                                           "maxP99LatencyMs": 100}})  # fmt: skip
    status = InferenceServiceStatus(stable_version="1", canary_version="2")
    target = analysis.target_for(spec, status, namespace="ns")
    assert spec.rollout.analysis is not None
    analysis.evaluate(source, spec.rollout.analysis, target)
    analysis.watch(source, spec.rollout.analysis, target, None, due=True)
    generative = spec.rollout.analysis.model_copy(update={"min_tokens_per_second_per_replica": 1.0})
    target = replace(target, generative=True)
    analysis.evaluate(source, generative, target)
    analysis.watch(source, generative, target, None, due=True)
    analysis.read_memory_figures(source, namespace="ns", model="m", version="1")
    analysis.read_stable_error_ratio(source, target.stable, "1m")
    return source.queries


def _selected_series(promql: str) -> dict[str, set[str]]:
    """Metric name → the labels the query's selectors match on."""
    selected: dict[str, set[str]] = {}
    for name, matchers in SELECTOR.findall(promql):
        selected.setdefault(name, set()).update(LABEL_MATCHER.findall(matchers))
    return selected


SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}")
LABEL_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
SCRAPE_LABELS = {"namespace"}
"""Added by the scrape (Kubernetes service discovery), not by the runtime."""


def test_queried_metrics_exist_with_their_labels() -> None:
    """Every series a rendered query selects is in the runtime's registry, with its labels.

    Labels: every one the query matches on, the scrape's `namespace` aside.
    """
    exposed = _exposed_metrics()
    queries = _rendered_queries()
    selected: dict[str, set[str]] = {}
    for promql in queries:
        for name, labels in _selected_series(promql).items():
            selected.setdefault(name, set()).update(labels)
    assert set(selected) == {
        contract.REQUESTS_METRIC,
        contract.REQUEST_DURATION_METRIC + "_bucket",
        contract.QUEUE_WAIT_METRIC + "_bucket",
        contract.TIME_TO_FIRST_TOKEN_METRIC + "_bucket",
        contract.INTER_TOKEN_LATENCY_METRIC + "_bucket",
        contract.GENERATION_TOKENS_METRIC,
        contract.PREEMPTIONS_METRIC,
        *contract.MemoryMetric,
    }
    assert {"model", "version", "track", "code"} <= selected[contract.REQUESTS_METRIC]
    for name, labels in selected.items():
        assert name in exposed, f"{name} is queried but the runtime does not export it"
        missing = labels - SCRAPE_LABELS - exposed[name]
        assert not missing, f"{name} is queried by {sorted(missing)}, labels it does not carry"


def test_latency_bounds_are_the_runtimes_buckets() -> None:
    """The sequential latency test counts answers slower than each bound the runtime exports."""
    assert contract.LATENCY_BOUNDS_S == LATENCY_BUCKETS_S


@pytest.mark.parametrize(
    "test", [analysis.LATENCY, analysis.TTFT, analysis.ITL], ids=lambda test: test.name
)
def test_each_latency_tests_bounds_are_its_histograms_exported_buckets(
    test: analysis.HistogramTest,
) -> None:
    """Every sequential latency test reads exactly the `le` bounds its histogram exports.

    The generative histograms differ: time to first token has the request buckets, the
    inter-token latency finer ones.
    """
    exported = {
        float(sample.labels["le"])
        for sample in _runtime_samples()
        if sample.name == f"{test.metric}_bucket"
    }
    assert exported == {*test.bounds, math.inf}
    assert analysis.TTFT.bounds != analysis.ITL.bounds


@pytest.mark.parametrize("kind", sorted(contract.KNOWN_BUILTINS))
def test_known_builtins_are_the_runtimes(kind: str) -> None:
    """Every builtin the operator accepts is one the runtime resolves."""
    resolve_handler(f"builtin://{kind}", name="m", version="1", max_sequence_length=32)


def test_unknown_builtin_is_rejected_by_the_runtime_too() -> None:
    """The operator's Degraded for an unknown builtin matches the runtime's refusal."""
    with pytest.raises(ValueError, match="unknown builtin model"):
        resolve_handler("builtin://gpt9", name="m", version="1", max_sequence_length=32)


def test_the_shadow_target_the_operator_writes_is_the_one_the_runtime_reads(
    tmp_path: Path,
) -> None:
    """The stable pods' flags with `rollout.shadow` parse, and so does the ConfigMap's file."""
    spec = make_spec(rollout={"shadow": {"fraction": 0.25, "minCosine": 0.98}})
    (stable, *_) = plan_tracks(spec, InferenceServiceStatus())
    assert stable.follows_shadow
    args = render.runtime_args(stable)
    config = parse_config(args)
    assert config.shadow.file == Path(contract.SHADOW_TARGET_FILE)
    assert config.shadow.enabled
    assert config.shadow.fixed_target() is None
    shadow = spec.rollout.shadow
    assert shadow is not None
    written = tmp_path / contract.SHADOW_TARGET_KEY
    written.write_text(contract.shadow_target("http://m-canary.ns.svc:80", shadow, "2.1"))
    assert read_target(written) == ShadowTarget(
        url="http://m-canary.ns.svc:80", fraction=0.25, version_label="2.1", min_cosine=0.98
    )
