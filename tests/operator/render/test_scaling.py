"""Autoscaling, disruption budgets, spreading, priority, precision and backend of a track."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.naming import Track
from fleetserve_operator.records import Manifest
from fleetserve_operator.render import Owner, desired_children, plan_tracks
from fleetserve_operator.render.pods import runtime_args
from fleetserve_operator.render.scaling import scaling_query
from fleetserve_operator.spec import InferenceServiceStatus, ScalingMetric
from fleetserve_operator.testing import FakeKube, make_service, make_spec

OWNER = Owner(name="demo", namespace="ns", uid="uid-demo")
PROMETHEUS = "http://prometheus.monitoring:9090"
MODEL = {"name": "demo", "version": "1", "uri": "builtin://synthetic"}
GENERATIVE = {"name": "chat", "version": "1", "uri": "builtin://synthetic-generate"}
SCALING = {"minReplicas": 2, "maxReplicas": 6, "metric": "inflightRequests", "target": 4}


def _children(
    status: InferenceServiceStatus | None = None, *, observed: int = 0, **sections: Any
) -> dict[tuple[str, str], Manifest]:
    spec = make_spec(**sections)
    children = desired_children(
        OWNER,
        spec,
        status or InferenceServiceStatus(),
        observed_stable_replicas=observed,
        prometheus_url=PROMETHEUS,
    )
    return {(child["kind"], child["metadata"]["name"]): child for child in children}


def _pod(children: dict[tuple[str, str], Manifest], track: Track) -> Manifest:
    pod: Manifest = children[("Deployment", f"demo-{track}")]["spec"]["template"]["spec"]
    return pod


def test_scaled_stable_track_renders_a_keda_scaled_object() -> None:
    """spec.scaling: a ScaledObject on the stable Deployment, owned and labelled like a child."""
    scaling = SCALING | {"scaleUpWindowSeconds": 30, "pollingIntervalSeconds": 5}
    children = _children(scaling=scaling)
    scaled = children[("ScaledObject", "demo-stable")]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["metadata"]["ownerReferences"][0]["uid"] == "uid-demo"
    assert scaled["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "fleetserve-operator"
    assert scaled["metadata"]["labels"]["serving.fleetserve.io/track"] == "stable"
    assert scaled["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "demo-stable"},
        "minReplicaCount": 2,
        "maxReplicaCount": 6,
        "pollingInterval": 5,
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {
                    "scaleUp": {"stabilizationWindowSeconds": 30},
                    "scaleDown": {"stabilizationWindowSeconds": 300},
                }
            }
        },
        "triggers": [
            {
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": PROMETHEUS,
                    "query": (
                        '(sum(fleetserve_inflight_requests{namespace="ns",model="demo",'
                        'track="stable"})) or vector(0)'
                    ),
                    "threshold": "4",
                },
            }
        ],
    }


def test_autoscaled_deployment_leaves_replicas_to_the_hpa() -> None:
    """The scaled track's Deployment carries no spec.replicas; without scaling it does."""
    scaled = _children(scaling=SCALING)[("Deployment", "demo-stable")]
    assert "replicas" not in scaled["spec"]
    fixed = _children(runtime={"replicas": {"min": 3, "max": 3}})
    assert fixed[("Deployment", "demo-stable")]["spec"]["replicas"] == 3
    assert not [key for key in fixed if key[0] == "ScaledObject"]


def test_without_scaling_a_single_replica_service_renders_what_it_did() -> None:
    """No spec.scaling, one replica: no ScaledObject, no PodDisruptionBudget."""
    kinds = sorted(kind for kind, _ in _children())
    assert kinds == ["Deployment", "Service", "Service"]


def test_each_metric_queries_the_runtime_series_of_its_track() -> None:
    """Queue wait is the track's p90 (Value), KV usage a per-replica share (AverageValue)."""
    wait = scaling_query(
        ScalingMetric.QUEUE_WAIT_P90, namespace="ns", model="m", track=Track.STABLE
    )
    assert wait == (
        "(histogram_quantile(0.9, sum by (le) (rate(fleetserve_queue_wait_seconds_bucket"
        '{namespace="ns",model="m",track="stable"}[1m]))) > 0) or vector(0)'
    )
    kv = scaling_query(
        ScalingMetric.KV_CACHE_USAGE, namespace="ns", model="m", track=Track.FALLBACK
    )
    assert kv == (
        '(sum(fleetserve_kv_cache_usage_ratio{namespace="ns",model="m",track="fallback"})) '
        "or vector(0)"
    )
    children = _children(
        model=GENERATIVE, scaling=SCALING | {"metric": "queueWaitP90", "target": 0.05}
    )
    trigger = children[("ScaledObject", "demo-stable")]["spec"]["triggers"][0]
    assert trigger["metricType"] == "Value"
    assert trigger["metadata"]["threshold"] == "0.05"
    assert 'model="chat"' in trigger["metadata"]["query"]


@pytest.mark.parametrize(
    ("target", "threshold"), [(4, "4"), (2.5, "2.5"), (0.00001, "0.00001"), (1_000_000, "1000000")]
)
def test_threshold_is_a_plain_decimal_string(target: float, threshold: str) -> None:
    """KEDA's trigger metadata holds strings: the target without exponent or trailing zero."""
    children = _children(scaling=SCALING | {"target": target})
    trigger = children[("ScaledObject", "demo-stable")]["spec"]["triggers"][0]
    assert trigger["metadata"]["threshold"] == threshold


def test_fallback_scaling_renders_its_own_scaled_object() -> None:
    """spec.fallback.scaling: the fallback Deployment is scaled; the stable one stays fixed."""
    fallback = {"enabled": True, "scaling": SCALING | {"metric": "kvCacheUsage", "target": 0.7}}
    children = _children(model=GENERATIVE, fallback=fallback)
    scaled = children[("ScaledObject", "demo-fallback")]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "demo-fallback"
    assert 'track="fallback"' in scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert "replicas" not in children[("Deployment", "demo-fallback")]["spec"]
    assert children[("Deployment", "demo-stable")]["spec"]["replicas"] == 1
    assert ("ScaledObject", "demo-stable") not in children


def test_canary_follows_weight_times_the_observed_stable_size() -> None:
    """At 25% with the HPA holding stable at 7 replicas, the canary gets ceil(1.75) = 2."""
    status = InferenceServiceStatus(phase="Progressing", canary_weight=25)
    plans = plan_tracks(make_spec(scaling=SCALING), status, observed_stable_replicas=7)
    sizes = {plan.config.track: plan.replicas for plan in plans}
    assert sizes == {Track.STABLE: None, Track.CANARY: 2}


def test_a_rollout_keeps_the_scaler_from_shrinking_stable() -> None:
    """While a rollout is active, minReplicaCount is the observed size (capped at max)."""
    for phase, observed, expected in (
        ("Progressing", 5, 5),
        ("Promoting", 4, 4),
        ("Promoting", 9, 6),
        ("Succeeded", 5, 2),
    ):
        status = InferenceServiceStatus(phase=phase, canary_weight=50)
        children = _children(status, observed=observed, scaling=SCALING)
        scaled = children[("ScaledObject", "demo-stable")]["spec"]
        assert scaled["minReplicaCount"] == expected, phase


def test_promotion_keeps_the_scaled_deployment_and_its_count() -> None:
    """Promoting rolls the same stable Deployment to the new spec, still without replicas."""
    spec = make_spec(model=MODEL | {"version": "2"}, scaling=SCALING)
    status = InferenceServiceStatus(phase="Promoting", canary_weight=100)
    status = status.model_copy(
        update={"rollout": status.rollout.model_copy(update={"stable_spec": spec.gpu_track})}
    )
    children = desired_children(
        OWNER, spec, status, observed_stable_replicas=4, prometheus_url=PROMETHEUS
    )
    by_key = {(c["kind"], c["metadata"]["name"]): c for c in children}
    stable = by_key[("Deployment", "demo-stable")]
    assert "replicas" not in stable["spec"]
    assert stable["metadata"]["labels"]["serving.fleetserve.io/model-version"] == "2"
    assert by_key[("Deployment", "demo-canary")]["spec"]["replicas"] == 4
    target = by_key[("ScaledObject", "demo-stable")]["spec"]["scaleTargetRef"]["name"]
    assert target == "demo-stable"


def test_disruption_budget_per_track_with_two_replicas_or_a_scaler() -> None:
    """A PDB selects its track's pods; one-replica tracks get none."""
    children = _children(
        runtime={"replicas": {"min": 2, "max": 2}},
        disruption={"maxUnavailable": "50%"},
        fallback={"enabled": True, "scaling": SCALING},
    )
    stable = children[("PodDisruptionBudget", "demo-stable")]
    assert stable["apiVersion"] == "policy/v1"
    assert stable["spec"] == {
        "maxUnavailable": "50%",
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "fleetserve-runtime",
                "app.kubernetes.io/instance": "demo",
                "serving.fleetserve.io/track": "stable",
            }
        },
    }
    fallback = children[("PodDisruptionBudget", "demo-fallback")]
    assert fallback["spec"]["maxUnavailable"] == 1
    assert fallback["spec"]["selector"]["matchLabels"]["serving.fleetserve.io/track"] == "fallback"
    single = _children(fallback={"enabled": True})
    assert not [key for key in single if key[0] == "PodDisruptionBudget"]


def test_pods_spread_over_nodes_and_zones_by_default() -> None:
    """ScheduleAnyway on hostname and zone, selecting the track's own pods."""
    (host, zone) = _pod(_children(), Track.STABLE)["topologySpreadConstraints"]
    assert host == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "fleetserve-runtime",
                "app.kubernetes.io/instance": "demo",
                "serving.fleetserve.io/track": "stable",
            }
        },
    }
    assert zone["topologyKey"] == "topology.kubernetes.io/zone"
    assert zone["whenUnsatisfiable"] == "ScheduleAnyway"


def test_spread_can_be_strict_on_nodes_or_off() -> None:
    """DoNotSchedule makes nodes strict (zones stay best-effort); Off renders none."""
    strict = _children(topologySpread="DoNotSchedule", fallback={"enabled": True})
    modes = [
        c["whenUnsatisfiable"] for c in _pod(strict, Track.STABLE)["topologySpreadConstraints"]
    ]
    assert modes == ["DoNotSchedule", "ScheduleAnyway"]
    fallback = _pod(strict, Track.FALLBACK)["topologySpreadConstraints"]
    assert fallback[0]["labelSelector"]["matchLabels"]["serving.fleetserve.io/track"] == "fallback"
    assert fallback[0]["whenUnsatisfiable"] == "ScheduleAnyway"
    off = _children(topologySpread="Off", fallback={"enabled": True, "topologySpread": "Off"})
    assert "topologySpreadConstraints" not in _pod(off, Track.STABLE)
    assert "topologySpreadConstraints" not in _pod(off, Track.FALLBACK)


def test_priority_class_per_track() -> None:
    """The GPU tracks' pods get priorityClassName, the fallback's fallback.priorityClassName."""
    children = _children(
        priorityClassName="inference-high",
        fallback={"enabled": True, "priorityClassName": "inference-low"},
    )
    assert _pod(children, Track.STABLE)["priorityClassName"] == "inference-high"
    assert _pod(children, Track.FALLBACK)["priorityClassName"] == "inference-low"
    assert "priorityClassName" not in _pod(_children(), Track.STABLE)


def test_precision_is_a_runtime_flag_per_track() -> None:
    """runtime.precision and fallback.precision become --precision; fp32 is left implicit."""
    spec = make_spec(runtime={"precision": "bf16"}, fallback={"enabled": True, "precision": "int8"})
    args = {
        plan.config.track: runtime_args(plan)
        for plan in plan_tracks(spec, InferenceServiceStatus())
    }
    assert "--precision=bf16" in args[Track.STABLE]
    assert "--precision=int8" in args[Track.FALLBACK]
    default = make_spec(fallback={"enabled": True})
    for plan in plan_tracks(default, InferenceServiceStatus()):
        assert not [arg for arg in runtime_args(plan) if arg.startswith("--precision")]


def test_precision_change_is_a_rollout_but_defaults_are_not() -> None:
    """A new precision changes the GPU tracks' digest; the new fields at defaults do not."""
    before = make_spec().gpu_track.digest
    assert make_spec(runtime={"precision": "fp32"}).gpu_track.digest == before
    assert make_spec(runtime={"precision": "int8"}).gpu_track.digest != before
    assert make_spec(scaling=SCALING, topologySpread="Off").gpu_track.digest == before


def _backend_args(**sections: Any) -> dict[Track, list[str]]:
    spec = make_spec(**sections)
    return {
        plan.config.track: [arg for arg in runtime_args(plan) if arg.startswith("--backend")]
        for plan in plan_tracks(spec, InferenceServiceStatus())
    }


def test_backend_is_a_runtime_flag_per_track() -> None:
    """runtime.backend and fallback.backend become --backend per track; auto is left implicit."""
    minilm = MODEL | {"uri": "builtin://minilm-l6"}
    pinned = _backend_args(
        model=minilm,
        runtime={"backend": "torch"},
        fallback={"enabled": True, "backend": "onnxruntime"},
    )
    assert pinned == {Track.STABLE: ["--backend=torch"], Track.FALLBACK: ["--backend=onnxruntime"]}
    fallback_only = _backend_args(model=minilm, fallback={"enabled": True, "backend": "torch"})
    assert fallback_only == {Track.STABLE: [], Track.FALLBACK: ["--backend=torch"]}
    explicit_auto = _backend_args(runtime={"backend": "auto"}, fallback={"enabled": True})
    assert explicit_auto == {Track.STABLE: [], Track.FALLBACK: []}


def test_backend_change_is_a_rollout_but_auto_is_not() -> None:
    """A pinned backend changes the GPU tracks' digest; `auto`, the default, does not."""
    before = make_spec().gpu_track.digest
    assert make_spec(runtime={"backend": "auto"}).gpu_track.digest == before
    assert make_spec(runtime={"backend": "torch"}).gpu_track.digest != before
    assert make_spec(fallback={"enabled": True, "backend": "torch"}).gpu_track.digest == before


ONNX = {"name": "enc", "version": "1", "uri": "pvc://models/enc/model.onnx"}
GPU = {"limits": {"nvidia.com/gpu": 1}}


def _first_refusal(sections: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """Where the spec with `sections` is refused first, and the message."""
    with pytest.raises(ValidationError) as caught:
        make_spec(**sections)
    error = caught.value.errors()[0]
    return tuple(str(part) for part in error["loc"]), error["msg"]


@pytest.mark.parametrize(
    ("sections", "location", "message"),
    [
        (
            {"runtime": {"backend": "tensorrt"}},
            ("runtime", "backend"),
            "'auto', 'torch' or 'onnxruntime'",
        ),
        (
            {"runtime": {"backend": "onnxruntime", "precision": "bf16"}},
            ("runtime",),
            "runtime.backend onnxruntime serves fp32 or int8, not bf16",
        ),
        (
            {"fallback": {"backend": "onnxruntime", "precision": "bf16"}},
            ("fallback",),
            "fallback.backend onnxruntime serves fp32 or int8, not bf16",
        ),
        (
            {"runtime": {"backend": "onnxruntime", "device": "cuda"}},
            ("runtime",),
            "runtime.backend onnxruntime runs on the CPU only",
        ),
        (
            {"runtime": {"backend": "onnxruntime", "resources": GPU}},
            ("runtime",),
            "runtime.backend onnxruntime runs on the CPU only",
        ),
        (
            {"model": ONNX, "runtime": {"backend": "torch"}},
            (),
            "runtime.backend torch does not apply to an .onnx model",
        ),
        (
            {"runtime": {"backend": "onnxruntime", "device": "cpu"}},
            (),
            "runtime.backend onnxruntime applies to builtin://minilm-l6 and .onnx models only",
        ),
        (
            {"model": ONNX | {"uri": "file:///models/enc/model.onnx?x=1"},
             "fallback": {"backend": "torch"}},
            (),
            "fallback.backend torch does not apply to an .onnx model",
        ),
        (
            {"fallback": {"backend": "onnxruntime"}},
            (),
            "fallback.backend onnxruntime applies to builtin://minilm-l6 and .onnx models only",
        ),
    ],
)  # fmt: skip
def test_bad_backends_are_refused_naming_them(
    sections: dict[str, Any], location: tuple[str, ...], message: str
) -> None:
    """A backend the track's device, precision or model rules out is refused, naming it."""
    refused_at, why = _first_refusal(sections)
    assert refused_at == location
    assert message in why


@pytest.mark.parametrize(
    "sections",
    [
        {"model": MODEL | {"uri": "builtin://minilm-l6"},
         "runtime": {"backend": "onnxruntime", "precision": "int8", "device": "cpu",
                     "resources": GPU}},
        {"model": MODEL | {"uri": "builtin://minilm-l6?x=1"}, "runtime": {"backend": "onnxruntime"},
         "fallback": {"backend": "onnxruntime", "precision": "int8"}},
        {"model": ONNX, "runtime": {"backend": "onnxruntime"}, "fallback": {"backend": "auto"}},
        {"model": MODEL | {"uri": "builtin://minilm-l6"}, "runtime": {"backend": "torch",
         "precision": "bf16", "device": "cuda"}, "fallback": {"backend": "torch"}},
    ],
)  # fmt: skip
def test_backends_that_can_serve_the_model_are_accepted(sections: dict[str, Any]) -> None:
    """ONNX Runtime on MiniLM or an .onnx file on the CPU, torch on anything but .onnx."""
    make_spec(**sections)


@pytest.mark.parametrize(
    ("sections", "location", "message"),
    [
        (
            {"scaling": SCALING | {"minReplicas": 7}},
            ("scaling",),
            "scaling.maxReplicas (6) must be >= scaling.minReplicas (7)",
        ),
        (
            {"scaling": SCALING | {"minReplicas": 0}},
            ("scaling", "minReplicas"),
            "greater than or equal to 1",
        ),
        (
            {"scaling": SCALING | {"maxReplicas": 1001}},
            ("scaling", "maxReplicas"),
            "less than or equal to 1000",
        ),
        ({"scaling": SCALING | {"target": 0}}, ("scaling", "target"), "greater than 0"),
        ({"scaling": SCALING | {"metric": "cpu"}}, ("scaling", "metric"), "inflightRequests"),
        (
            {"scaling": SCALING | {"scaleDownWindowSeconds": 3601}},
            ("scaling", "scaleDownWindowSeconds"),
            "less than or equal to 3600",
        ),
        (
            {"scaling": SCALING | {"pollingIntervalSeconds": 0}},
            ("scaling", "pollingIntervalSeconds"),
            "greater than or equal to 1",
        ),
        (
            {"scaling": SCALING | {"metric": "kvCacheUsage", "target": 0.5}},
            (),
            "scaling.metric kvCacheUsage applies to generative models only",
        ),
        (
            {"fallback": {"scaling": SCALING | {"metric": "kvCacheUsage", "target": 0.5}}},
            (),
            "fallback.scaling.metric kvCacheUsage applies to generative models only",
        ),
        (
            {"model": GENERATIVE, "scaling": SCALING | {"metric": "kvCacheUsage", "target": 2}},
            ("scaling",),
            "scaling.target (2.0) is a fraction of the KV cache (0-1]",
        ),
        (
            {"scaling": SCALING, "runtime": {"replicas": {"min": 1, "max": 3}}},
            (),
            "runtime.replicas (min < max: an autoscaler of your own) and scaling (KEDA) both size",
        ),
        (
            {"fallback": {"scaling": SCALING, "replicas": {"min": 1, "max": 3}}},
            ("fallback",),
            "fallback.replicas and fallback.scaling both size the fallback track",
        ),
        (
            {"disruption": {"maxUnavailable": 0}},
            ("disruption", "maxUnavailable"),
            "maxUnavailable must be a count 1..1000 or a percentage 1%..100%, got 0",
        ),
        (
            {"fallback": {"disruption": {"maxUnavailable": "150%"}}},
            ("fallback", "disruption", "maxUnavailable"),
            "got '150%'",
        ),
        ({"topologySpread": "Sometimes"}, ("topologySpread",), "ScheduleAnyway"),
        ({"priorityClassName": "Not_A_Name"}, ("priorityClassName",), "pattern"),
        ({"runtime": {"precision": "fp16"}}, ("runtime", "precision"), "'fp32', 'bf16' or 'int8'"),
        (
            {"fallback": {"precision": "int4"}},
            ("fallback", "precision"),
            "'fp32', 'bf16' or 'int8'",
        ),
    ],
)
def test_bad_fields_are_refused_naming_them(
    sections: dict[str, Any], location: tuple[str, ...], message: str
) -> None:
    """Each new field's refusal names it (location, or the message for cross-field rules)."""
    refused_at, why = _first_refusal(sections)
    assert refused_at == location
    assert message in why


def test_without_prometheus_scaling_is_degraded_naming_spec_scaling() -> None:
    """No Prometheus URL anywhere: nothing is applied, Degraded names spec.scaling."""
    kube = FakeKube()
    kube.add_service(make_service({"model": MODEL, "scaling": SCALING}))
    sync = Sync(kube, metrics=OperatorMetrics())
    error = sync.run_by_name("ns", "demo", trigger="create")
    assert error is not None
    assert (error.reason, error.field) == ("DependencyMissing", "spec.scaling")
    assert not [write for write in kube.writes if write[0] in ("create", "apply")]


def test_replicas_the_hpa_sets_are_never_written_back() -> None:
    """The HPA scales the stable Deployment: the next reconciles write nothing at all."""
    kube = FakeKube()
    kube.add_service(make_service({"model": MODEL, "scaling": SCALING}))
    sync = Sync(kube, metrics=OperatorMetrics(), default_prometheus_url=PROMETHEUS)
    assert sync.run_by_name("ns", "demo", trigger="create") is None
    kube.set_ready("demo-stable")
    sync.run_by_name("ns", "demo", trigger="child")
    assert ("ScaledObject", "ns", "demo-stable") in kube.objects
    assert ("PodDisruptionBudget", "ns", "demo-stable") in kube.objects
    kube.objects[("Deployment", "ns", "demo-stable")]["spec"]["replicas"] = 5
    kube.set_ready("demo-stable")
    settled = len(kube.writes)
    for _ in range(3):
        assert sync.run_by_name("ns", "demo", trigger="child") is None
    assert kube.writes[settled:] == [("status", "InferenceService", "demo")]
    assert kube.objects[("Deployment", "ns", "demo-stable")]["spec"]["replicas"] == 5
    assert sync.run_by_name("ns", "demo", trigger="resync") is None
    assert len(kube.writes) == settled + 1
