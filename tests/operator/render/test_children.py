"""Rendering children from specs: every spec field lands where the runtime or Kubernetes reads."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleetserve_operator import naming
from fleetserve_operator.render import (
    APPLIED_HASH_ANNOTATION,
    INFERENCE_PATHS,
    PODS_PHASE,
    child_key,
    desired_children,
    first_create_phase,
    is_controlled_by,
    is_drifted,
    needs_write,
    stale_children,
    traffic_weights,
)
from fleetserve_operator.spec import InferenceServiceStatus
from fleetserve_operator.testing import make_spec
from tests.operator.render.rendered import OWNER, children_by_key, flag_value

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw", "sectionName": "http"}]}


def _children(**sections: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return children_by_key(make_spec(**sections))


def _container(children: dict[tuple[str, str], Any], name: str = "demo-stable") -> Any:
    return children[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


@pytest.mark.parametrize(
    ("sections", "flag", "value"),
    [
        pytest.param({"model": {"name": "enc", "version": "7", "uri": "builtin://minilm-l6"}},
                     "--model", "builtin://minilm-l6", id="model.uri"),
        pytest.param({"model": {"name": "enc", "version": "7", "uri": "builtin://minilm-l6"}},
                     "--name", "enc", id="model.name"),
        pytest.param({"model": {"name": "enc", "version": "7", "uri": "builtin://minilm-l6"}},
                     "--version", "7", id="model.version"),
        pytest.param({"model": {"name": "m", "version": "1", "handler": "pkg.mod:make"}},
                     "--model", "pkg.mod:make", id="model.handler"),
        pytest.param({"model": {"name": "m", "version": "1", "uri": "pvc://weights/enc/v7"}},
                     "--model", "file:///models/enc/v7", id="model.uri-pvc"),
        pytest.param({"runtime": {"device": "cuda"}}, "--device", "cuda", id="runtime.device"),
        pytest.param({"runtime": {"threads": 4}}, "--threads", "4", id="runtime.threads"),
        pytest.param({"batching": {"maxBatchSize": 64}}, "--max-batch-size", "64",
                     id="maxBatchSize"),
        pytest.param({"batching": {"maxQueueDelayMs": 2.5}}, "--max-queue-delay-ms", "2.5",
                     id="maxQueueDelayMs"),
        pytest.param({"batching": {"maxSequenceLength": 512}}, "--max-sequence-length", "512",
                     id="maxSequenceLength"),
        pytest.param({"batching": {"buckets": "16,32"}}, "--buckets", "16,32", id="buckets"),
        pytest.param({"batching": {"maxBatchTokens": 4096}}, "--max-batch-tokens", "4096",
                     id="maxBatchTokens"),
        pytest.param({"batching": {"maxQueueSize": 64}}, "--max-queue-size", "64",
                     id="maxQueueSize"),
        pytest.param({"batching": {"maxQueueSize": 64}}, "--max-instances", "64",
                     id="small-queue-caps-instances"),
        pytest.param({"batching": {"defaultTimeoutMs": 100}}, "--default-timeout-ms", "100",
                     id="defaultTimeoutMs"),
        pytest.param({"batching": {"maxTimeoutMs": 60000}}, "--max-timeout-ms", "60000",
                     id="maxTimeoutMs"),
        pytest.param({"memory": {"budget": "1Gi"}}, "--memory-budget-bytes", str(2**30),
                     id="memory.budget"),
        pytest.param({"memory": {"reserveFraction": 0.2}}, "--memory-reserve-fraction", "0.2",
                     id="memory.reserveFraction"),
        pytest.param({}, "--track", "stable", id="track"),
        pytest.param({}, "--port", "8080", id="port"),
    ],
)  # fmt: skip
def test_stable_args_render_the_spec(sections: dict[str, Any], flag: str, value: str) -> None:
    """Each batching/memory/model field becomes the runtime flag of the same meaning."""
    assert flag_value(_container(_children(**sections))["args"], flag) == value


@pytest.mark.parametrize(
    ("sections", "path", "value"),
    [
        pytest.param({"runtime": {"image": "reg/rt:2"}}, "image", "reg/rt:2", id="image"),
        pytest.param({"runtime": {"imagePullPolicy": "Always"}}, "imagePullPolicy", "Always",
                     id="imagePullPolicy"),
        pytest.param({"runtime": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
                     "resources.limits.nvidia.com/gpu", "1", id="gpu-limit"),
        pytest.param({"runtime": {"resources": {"requests": {"memory": "8Gi"}}}},
                     "resources.requests.memory", "8Gi", id="memory-request"),
        pytest.param({"runtime": {"env": [{"name": "FLEETSERVE_LOG_LEVEL", "value": "debug"}]}},
                     "env.0", {"name": "FLEETSERVE_LOG_LEVEL", "value": "debug"}, id="env"),
        pytest.param({"runtime": {"env": [{"name": "T", "valueFrom": {
                         "secretKeyRef": {"name": "s", "key": "k"}}}]}},
                     "env.0.valueFrom.secretKeyRef.key", "k", id="env-secret"),
        pytest.param({}, "readinessProbe.httpGet.path", "/v2/health/ready", id="readiness"),
        pytest.param({}, "livenessProbe.httpGet.path", "/v2/health/live", id="liveness"),
        pytest.param({}, "startupProbe.httpGet.path", "/v2/health/ready", id="startup"),
        pytest.param({}, "terminationMessagePolicy", "FallbackToLogsOnError",
                     id="termination-message"),
        pytest.param({}, "securityContext.readOnlyRootFilesystem", True, id="read-only-root"),
        pytest.param({}, "securityContext.allowPrivilegeEscalation", False, id="no-escalation"),
        pytest.param({}, "securityContext.capabilities.drop", ["ALL"], id="drop-all"),
        pytest.param({}, "command", ["fleetserve-runtime", "serve"], id="command"),
        pytest.param({}, "ports.0.containerPort", 8080, id="port"),
    ],
)  # fmt: skip
def test_container_fields(sections: dict[str, Any], path: str, value: Any) -> None:
    """Runtime fields land in the container."""
    container = _container(_children(**sections))
    head, _, leaf = path.partition(".nvidia.com/")
    found = _get(container, head)["nvidia.com/" + leaf] if leaf else _get(container, path)
    assert found == value


@pytest.mark.parametrize(
    ("sections", "path", "value"),
    [
        pytest.param({"runtime": {"replicas": {"min": 3, "max": 3}}}, "spec.replicas", 3,
                     id="fixed-replicas"),
        pytest.param({"runtime": {"nodeSelector": {"gpu": "a100"}}},
                     "spec.template.spec.nodeSelector.gpu", "a100", id="nodeSelector"),
        pytest.param({"runtime": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}},
                     "spec.template.spec.tolerations.0.operator", "Exists", id="tolerations"),
        pytest.param({"runtime": {"serviceAccountName": "rt"}},
                     "spec.template.spec.serviceAccountName", "rt", id="serviceAccountName"),
        pytest.param({}, "spec.template.spec.securityContext.seccompProfile.type", "RuntimeDefault",
                     id="seccomp"),
        pytest.param({}, "spec.template.spec.securityContext.runAsNonRoot", True, id="non-root"),
        pytest.param({}, "spec.template.metadata.annotations.prometheus.io/scrape", "true",
                     id="scrape"),
        pytest.param({}, "metadata.ownerReferences.0.uid", "uid-1", id="owner"),
        pytest.param({}, "spec.strategy.rollingUpdate.maxUnavailable", 0, id="no-unavailable"),
    ],
)  # fmt: skip
def test_deployment_fields(sections: dict[str, Any], path: str, value: Any) -> None:
    """Replicas, scheduling, security and ownership of the stable Deployment."""
    deployment = _children(**sections)[("Deployment", "demo-stable")]
    if "prometheus.io/" in path:
        head, _, key = path.partition(".prometheus.io/")
        assert _get(deployment, head)["prometheus.io/" + key] == value
    else:
        assert _get(deployment, path) == value


def test_autoscaled_replicas_are_left_to_the_autoscaler() -> None:
    """With max > min the operator applies no replica count, so it never fights an HPA."""
    deployment = _children(runtime={"replicas": {"min": 1, "max": 4}})[
        ("Deployment", "demo-stable")
    ]
    assert "replicas" not in deployment["spec"]


def test_pvc_model_is_mounted_read_only() -> None:
    """A pvc:// model mounts its claim read-only at /models."""
    children = _children(model={"name": "m", "version": "1", "uri": "pvc://weights/enc"})
    pod = children[("Deployment", "demo-stable")]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert volume["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert mount == {"name": "model", "mountPath": "/models", "readOnly": True}


def test_fallback_runs_on_cpu_with_its_overrides() -> None:
    """The fallback track: CPU device, its own resources, batching overrides, min replicas."""
    children = _children(fallback={
        "enabled": True, "replicas": {"min": 1, "max": 3}, "threads": 2,
        "resources": {"requests": {"cpu": "4"}}, "nodeSelector": {"pool": "cpu"},
        "batching": {"maxBatchSize": 4},
    })  # fmt: skip
    container = _container(children, "demo-fallback")
    assert flag_value(container["args"], "--device") == "cpu"
    assert flag_value(container["args"], "--track") == "fallback"
    assert flag_value(container["args"], "--max-batch-size") == "4"
    assert flag_value(container["args"], "--threads") == "2"
    assert container["resources"] == {"requests": {"cpu": "4"}}
    deployment = children[("Deployment", "demo-fallback")]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert ("Service", "demo-fallback") in children


def test_children_without_gateway() -> None:
    """Replicas provider: stable Deployment and Services, no HTTPRoute, no fallback."""
    assert sorted(_children()) == [
        ("Deployment", "demo-stable"), ("Service", "demo"), ("Service", "demo-stable"),
    ]  # fmt: skip


def test_umbrella_service_selects_the_gpu_pool() -> None:
    """The umbrella Service spreads over GPU-track pods; a warm fallback gets no traffic."""
    service = _children(fallback={"enabled": True})[("Service", "demo")]
    assert service["spec"]["selector"][naming.POOL_LABEL] == "gpu"
    assert service["spec"]["ports"][0]["port"] == 80


def test_http_route_sends_everything_to_stable() -> None:
    """gateway-api: weighted backendRefs, stable 100, a warm fallback listed at 0."""
    children = _children(
        traffic={**GATEWAY, "hostnames": ["a.example"]}, fallback={"enabled": True}
    )
    route = children[("HTTPRoute", "demo")]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [{"name": "gw", "sectionName": "http"}]
    assert route["spec"]["hostnames"] == ["a.example"]
    refs = route["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [("demo-stable", 100), ("demo-fallback", 0)]


def test_http_route_exposes_only_the_models_inference_paths() -> None:
    """The route matches `/v2/models/<name>` and `/v1/models/<name>:predict`, never `/`."""
    children = _children(
        model={"name": "enc", "version": "1", "uri": "builtin://synthetic"}, traffic=GATEWAY
    )
    (rule,) = children[("HTTPRoute", "demo")]["spec"]["rules"]
    assert rule["matches"] == [
        {"path": {"type": "PathPrefix", "value": "/v2/models/enc"}},
        {"path": {"type": "PathPrefix", "value": "/v1/models/enc:predict"}},
    ]
    assert len(rule["matches"]) == len(INFERENCE_PATHS)


def test_fallback_active_moves_traffic_and_replicas() -> None:
    """With FallbackActive true (set by the rollout issue) traffic and replicas move to CPU."""
    status = InferenceServiceStatus.model_validate({"conditions": [{
        "type": "FallbackActive", "status": "True", "reason": "GPUTrackDown",
        "lastTransitionTime": "2025-01-01T00:00:00Z"}]})  # fmt: skip
    spec = make_spec(fallback={"enabled": True, "replicas": {"min": 1, "max": 3}}, traffic=GATEWAY)
    assert traffic_weights(spec, status) == {naming.Track.STABLE: 0, naming.Track.FALLBACK: 100}
    children = children_by_key(spec, status)
    assert children[("Deployment", "demo-fallback")]["spec"]["replicas"] == 3
    assert children[("Service", "demo")]["spec"]["selector"][naming.POOL_LABEL] == "cpu"


def test_labels_follow_the_naming_vocabulary() -> None:
    """Every child carries instance, managed-by; tracks add track and model-version."""
    for (_, name), child in _children().items():
        labels = child["metadata"]["labels"]
        assert labels[naming.INSTANCE_LABEL] == "demo", name
        assert labels[naming.MANAGED_BY_LABEL] == "fleetserve-operator", name
    deployment = _children()[("Deployment", "demo-stable")]
    assert deployment["metadata"]["labels"][naming.MODEL_VERSION_LABEL] == "1"
    assert naming.MODEL_VERSION_LABEL not in deployment["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize(
    ("desired", "observed", "drifted"),
    [
        pytest.param({"a": 1}, {"a": 1, "b": 2}, False, id="server-added-fields"),
        pytest.param({"a": 1}, {"a": 2}, True, id="changed"),
        pytest.param({"a": {"b": 1}}, {}, True, id="missing"),
        pytest.param({"l": [{"x": 1}]}, {"l": [{"x": 1, "d": 0}]}, False, id="list-defaults"),
        pytest.param({"l": [1, 2]}, {"l": [1]}, True, id="list-length"),
        pytest.param({"q": 2}, {"q": "2"}, False, id="quantity-as-string"),
    ],
)
def test_is_drifted(desired: Any, observed: Any, drifted: bool) -> None:
    """Drift means a desired field is missing or different; extra fields are fine."""
    assert is_drifted(desired, observed) is drifted


def test_stale_children_are_only_our_own() -> None:
    """A child no longer desired is stale only if this owner controls it."""
    ours = {"kind": "Deployment", "metadata": {"name": "demo-fallback",
            "ownerReferences": [OWNER.reference()]}}  # fmt: skip
    foreign = {"kind": "Deployment", "metadata": {"name": "other", "ownerReferences": []}}
    desired = desired_children(OWNER, make_spec(), InferenceServiceStatus())
    assert stale_children(OWNER, desired, [ours, foreign]) == [ours]


@pytest.mark.parametrize(
    ("managers", "written"),
    [
        pytest.param([("fleetserve-operator", "Apply")], False, id="applied"),
        pytest.param([("fleetserve-operator", "Update")], False, id="created-not-yet-applied"),
        pytest.param([("kubectl", "Apply")], True, id="applied-by-someone-else"),
    ],
)
def test_a_child_is_written_when_the_operator_owns_none_of_its_fields(
    managers: list[tuple[str, str]], written: bool
) -> None:
    """No drift, yet a child someone else took over is applied; one it created is left."""
    (child, *_) = desired_children(OWNER, make_spec(), InferenceServiceStatus())
    observed = {**child, "metadata": {**child["metadata"], "managedFields": [
        {"manager": manager, "operation": operation} for manager, operation in managers
    ]}}  # fmt: skip
    assert needs_write(child, observed) is written


def test_every_child_is_owned_for_garbage_collection_and_has_its_api_shape() -> None:
    """Each child names its API and carries the controller owner reference.

    The garbage collector and `is_controlled_by` read that reference; Deployments roll
    without dropping a request.
    """
    children = _children(traffic=GATEWAY, fallback={"enabled": True})
    reference = {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "name": "demo",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    api = {"Deployment": "apps/v1", "Service": "v1", "HTTPRoute": "gateway.networking.k8s.io/v1"}
    for (kind, _), child in children.items():
        assert child["apiVersion"] == api[kind]
        assert child["metadata"]["ownerReferences"] == [reference]
    for track in ("stable", "fallback"):
        deployment = children[("Deployment", f"demo-{track}")]["spec"]
        assert deployment["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }
        assert deployment["revisionHistoryLimit"] == 3
        assert deployment["selector"]["matchLabels"] == naming.selector("demo", naming.Track(track))


def test_track_services_carry_their_track_labels() -> None:
    """A track's Service is labelled with its track and pool; the umbrella Service with none."""
    children = _children(traffic=GATEWAY, fallback={"enabled": True})
    for track in (naming.Track.STABLE, naming.Track.FALLBACK):
        labels = children[("Service", f"demo-{track.value}")]["metadata"]["labels"]
        assert labels == naming.labels("demo", track)
    assert children[("Service", "demo")]["metadata"]["labels"] == naming.labels("demo")


def test_stable_keeps_its_spec_but_takes_replica_bounds_from_the_current_one() -> None:
    """Mid-rollout the stable track runs status.rollout.stableSpec, sized by today's spec."""
    old = make_spec(runtime={"replicas": {"min": 1, "max": 1}}, fallback={"enabled": True})
    new = make_spec(
        model={"name": "demo", "version": "2", "uri": "builtin://synthetic"},
        runtime={"replicas": {"min": 3, "max": 3}},
        fallback={"enabled": True},
    )
    status = InferenceServiceStatus.model_validate(
        {"phase": "Succeeded", "rollout": {"stableSpec": old.gpu_track.model_dump(by_alias=True)}}
    )
    children = children_by_key(new, status)
    stable = children[("Deployment", "demo-stable")]
    assert stable["spec"]["replicas"] == 3
    version = stable["metadata"]["labels"][naming.MODEL_VERSION_LABEL]
    assert version == old.model.version
    fallback = children[("Deployment", "demo-fallback")]
    assert fallback["metadata"]["labels"][naming.MODEL_VERSION_LABEL] == old.model.version


def test_track_services_and_route_reach_the_pods_named_http_port() -> None:
    """Each track Service selects its track's pods on their `http` port.

    The HTTPRoute sends to those Services on the spec's port.
    """
    port = 8080
    children = _children(traffic=GATEWAY | {"port": port}, fallback={"enabled": True})
    for track in (naming.Track.STABLE, naming.Track.FALLBACK):
        service = children[("Service", f"demo-{track.value}")]["spec"]
        assert service == {
            "type": "ClusterIP",
            "selector": naming.selector("demo", track),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        }
    route = children[("HTTPRoute", "demo")]
    assert route["metadata"]["labels"] == naming.labels("demo")
    ports = {ref["port"] for ref in route["spec"]["rules"][0]["backendRefs"]}
    assert ports == {port}


def test_every_child_records_what_the_operator_applied() -> None:
    """The applied-hash annotation is stable for the same spec and moves with any change."""
    first = _children(traffic=GATEWAY)
    again = _children(traffic=GATEWAY)
    changed = _children(traffic=GATEWAY, runtime={"threads": 3})
    hashes = {
        key: child["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]
        for key, child in first.items()
    }
    assert all(re.fullmatch(r"[0-9a-f]{16}", digest) for digest in hashes.values())
    assert hashes == {
        key: child["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]
        for key, child in again.items()
    }
    stable = changed[("Deployment", "demo-stable")]["metadata"]["annotations"]
    assert stable[APPLIED_HASH_ANNOTATION] != hashes[("Deployment", "demo-stable")]


def test_a_controller_reference_to_another_object_is_not_ours() -> None:
    """Only a controller reference with our uid makes a child ours."""
    theirs = {"uid": "uid-other", "controller": True}
    ours_not_controller = {"uid": OWNER.uid, "controller": False}
    for ref in (theirs, ours_not_controller):
        assert not is_controlled_by(OWNER, {"metadata": {"ownerReferences": [ref]}})
    mine = {"metadata": {"ownerReferences": [{"uid": OWNER.uid, "controller": True}]}}
    assert is_controlled_by(OWNER, mine)


def test_an_autoscaled_canary_is_sized_from_the_observed_stable() -> None:
    """With an autoscaler the stable count is left alone and the canary follows what runs."""
    spec = make_spec(runtime={"replicas": {"min": 2, "max": 10}})
    status = InferenceServiceStatus(phase="Progressing", canary_weight=50)
    children = children_by_key(spec, status, observed_stable_replicas=6)
    assert "replicas" not in children[("Deployment", "demo-stable")]["spec"]
    assert children[("Deployment", "demo-canary")]["spec"]["replicas"] == 3


def test_fallback_pods_take_the_fallback_tolerations() -> None:
    """The CPU pool's tolerations are the fallback's own, not the GPU tracks'."""
    toleration = {"key": "pool", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}
    children = _children(fallback={"enabled": True, "tolerations": [toleration]})
    pod = children[("Deployment", "demo-fallback")]["spec"]["template"]["spec"]
    assert pod["tolerations"] == [toleration]


@pytest.mark.parametrize(
    "sections",
    [
        pytest.param({}, id="plain"),
        pytest.param(
            {
                "traffic": {**GATEWAY, "hostnames": ["demo.example"]},
                "runtime": {"grpc": {"enabled": True}},
                "scaling": {"minReplicas": 2, "maxReplicas": 4, "target": 2},
                "rollout": {"shadow": {"fraction": 0.2}},
            },
            id="every-kind",
        ),
    ],
)
def test_a_first_create_makes_what_each_child_names_before_it_and_pods_last(
    sections: dict[str, Any],
) -> None:
    """In `first_create_phase` order a route's backends and a scaler's target come first.

    And the Deployments come after every child but the scalers (`PODS_PHASE`), so that a
    refusal is undone before any pod starts.
    """
    children = desired_children(
        OWNER, make_spec(**sections), InferenceServiceStatus(), prometheus_url="http://p:9090"
    )
    phase = {child_key(child): first_create_phase(child) for child in children}
    for child in children:
        key = child_key(child)
        if key[0] == "Deployment":
            assert phase[key] == PODS_PHASE
        elif key[0] == "ScaledObject":
            target = child["spec"]["scaleTargetRef"]["name"]
            assert phase[key] > phase[("Deployment", target)]
        else:
            assert phase[key] < PODS_PHASE, key
        for rule in child["spec"].get("rules", []) if key[0].endswith("Route") else []:
            for ref in rule["backendRefs"]:
                assert phase[("Service", ref["name"])] < phase[key], (key, ref)
