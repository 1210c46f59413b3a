"""Pure reconciliation: an InferenceService's spec and status → the child objects it needs.

`sync` calls `desired_children` and writes the result through `kube` (create-only for new
children, server-side apply for the operator's own); nothing here talks to the cluster. Children
are plain dicts in the API's own shape, carrying only the fields the operator owns (server-side
apply leaves every other field to its owner). Everything that changes during a rollout is
rendered from `status`, which `rollout.next_step` wrote: the stable track runs
`status.rollout.stableSpec`, the canary exists only while a rollout is active, replica counts
follow `rollout.plan_capacity` and HTTPRoute weights `rollout.traffic_split`. An autoscaled
track's Deployment leaves its replica count to the HPA of the KEDA ScaledObject rendered
beside it, and a track of 2 or more replicas (or autoscaled) gets a PodDisruptionBudget
(both from `render.scaling`). The HTTPRoute exposes only the inference paths of the model's task
(`INFERENCE_PATHS` for an encoder, `GENERATION_PATHS` for a generative model), never the
runtime's admin endpoints. When a track's pods serve gRPC (`spec.runtime.grpc`) its Service
gains an h2c `grpc` port, and with `gateway-api` a GRPCRoute beside the HTTPRoute sends
`inference.GRPCInferenceService` calls to the same tracks with the same weights.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from fleetserve_operator import contract, naming
from fleetserve_operator.errors import InvalidSpec
from fleetserve_operator.naming import Track
from fleetserve_operator.records import Manifest
from fleetserve_operator.render import scaling
from fleetserve_operator.render.pods import TrackPlan, pod_template
from fleetserve_operator.rollout import fallback_active, plan_capacity, traffic_split
from fleetserve_operator.spec import (
    BatchingSpec,
    DisruptionSpec,
    GenerationSpec,
    GpuTrackSpec,
    GrpcSpec,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ScalingSpec,
    TrafficProvider,
)

__all__ = [
    "APPLIED_HASH_ANNOTATION",
    "GENERATION_PATHS",
    "GRPC_SERVICE",
    "HTTPROUTE_API_VERSION",
    "INFERENCE_PATHS",
    "Owner",
    "check_semantics",
    "child_key",
    "converge_phase",
    "desired_children",
    "fallback_generation",
    "is_controlled_by",
    "is_drifted",
    "needs_write",
    "plan_tracks",
    "route_matches",
    "stable_pods",
    "stale_children",
    "traffic_weights",
]

HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
GRPC_SERVICE = "inference.GRPCInferenceService"
"""The one gRPC service the GRPCRoute sends to the runtime (the inference RPCs only: the
runtime serves no model control over gRPC)."""
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
APPLIED_HASH_ANNOTATION = f"{naming.GROUP}/applied-hash"
"""A hash of everything the operator applies to a child, so that a field the spec no longer
asks for (a hostname, a node selector entry) is a drift too: `is_drifted` alone only sees
desired fields that are missing or different, never ones that should be gone."""
INFERENCE_PATHS = (
    "/v2/models/{model}",
    "/v1/models/{model}:predict",
)
"""Path prefixes the HTTPRoute sends to the runtime; `{model}` is `spec.model.name`.

Everything else the runtime serves (`/v2/repository/...` loads and unloads models,
`/metrics`, `/docs`, the server-wide health and metadata) stays unreachable from the
gateway. A new inference API is one more entry here.
"""
GENERATION_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/models/{model}",
    "/v2/models/{model}/generate",
    "/v2/models/{model}/generate_stream",
)
"""Exact paths a generative model's HTTPRoute sends to the runtime.

The OpenAI routes and the OIP generate extension of `spec.model.name` only: its `infer`,
other models' paths and the version-pinned `/versions/{v}/generate` (the rollout, not the
client, picks the version) stay unreachable. The OpenAI paths carry no model name, so a
generative service's route also matches its own `spec.traffic.hostnames` (the spec
requires them with `gateway-api`): two generative services on one Gateway stay apart by
hostname, as an OpenAI client's `base_url` addresses them.
"""


@dataclass(frozen=True, slots=True)
class Owner:
    """The InferenceService whose children are rendered."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> Manifest:
        """The controller owner reference every child carries (for garbage collection)."""
        return {
            "apiVersion": naming.API_VERSION,
            "kind": naming.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, labels: dict[str, str]) -> Manifest:
        """Child metadata: name, namespace, labels and the owner reference."""
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": labels,
            "ownerReferences": [self.reference()],
        }


def check_semantics(owner: Owner, spec: InferenceServiceSpec) -> None:
    """Reject what the schema lets through but no cluster can run.

    Raises:
        InvalidSpec: naming the field at fault.
    """
    longest = naming.MAX_NAME_LENGTH
    if len(owner.name) > longest or _DNS_1035.match(owner.name) is None:
        msg = f"must be a DNS-1035 label of at most {longest} characters, got {owner.name!r}"
        raise InvalidSpec("metadata.name", msg)
    uri = spec.model.uri or ""
    if uri.startswith("builtin://"):
        kind = uri.removeprefix("builtin://").split("?", 1)[0]
        if kind not in contract.KNOWN_BUILTINS:
            known = ", ".join(sorted(contract.KNOWN_BUILTINS))
            raise InvalidSpec("spec.model.uri", f"unknown builtin model {kind!r}; known: {known}")
    fallback_batching(spec, spec.batching)
    fallback_generation(spec, spec.gpu_track.generation_knobs)


def fallback_generation(
    spec: InferenceServiceSpec, base: GenerationSpec | None
) -> GenerationSpec | None:
    """The fallback's engine knobs: `base` with `spec.fallback.generation` laid over it."""
    overrides = spec.fallback.generation
    if base is None or overrides is None:
        return base
    try:
        return overrides.merged_over(base)
    except ValueError as exc:
        raise InvalidSpec("spec.fallback.generation", str(exc)) from None


def fallback_batching(spec: InferenceServiceSpec, base: BatchingSpec) -> BatchingSpec:
    """The fallback's batching: `base` with `spec.fallback.batching` laid over it."""
    try:
        return spec.fallback.batching.merged_over(base)
    except ValueError as exc:
        raise InvalidSpec("spec.fallback.batching", str(exc)) from None


def stable_pods(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> GpuTrackSpec:
    """What the stable track runs: `status.rollout.stableSpec`, else (first deploy) the spec.

    The stable track moves to a new spec only when the rollout promotes it, never because
    the spec changed; replica bounds always come from the current spec.
    """
    pods = status.rollout.stable_spec or spec.gpu_track
    return pods.model_copy(
        update={"runtime": pods.runtime.model_copy(update={"replicas": spec.runtime.replicas})}
    )


def _gpu_plan(
    spec: InferenceServiceSpec, pods: GpuTrackSpec, track: Track, replicas: int | None
) -> TrackPlan:
    runtime = pods.runtime
    return TrackPlan(
        config=contract.TrackConfig(
            track, pods.model.version, pods.batching, runtime.device, runtime.threads
        ),
        replicas=replicas,
        resources=runtime.resources,
        node_selector=runtime.node_selector,
        tolerations=runtime.tolerations,
        pods=pods,
        spec_hash=pods.digest,
        generation=pods.generation_knobs,
        precision=runtime.precision,
        backend=runtime.backend,
        spread=spec.topology_spread,
        priority_class_name=spec.priority_class_name,
    )


def plan_tracks(
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    *,
    observed_stable_replicas: int = 0,
) -> list[TrackPlan]:
    """The tracks to run now, sized by `rollout.plan_capacity`.

    Stable always (on its own spec); the canary while a rollout is active (on the current
    spec); the fallback when enabled (on stable's spec, grown to max while it is active).
    `observed_stable_replicas` is the stable Deployment's count, which an autoscaler owns.
    """
    capacity = plan_capacity(spec, status, stable_replicas=observed_stable_replicas)
    stable = stable_pods(spec, status)
    plans = [_gpu_plan(spec, stable, Track.STABLE, capacity.stable)]
    phase = status.current_phase
    if phase.is_rollout_active:
        plans.append(_gpu_plan(spec, spec.gpu_track, Track.CANARY, capacity.canary))
    if not spec.fallback.enabled:
        return plans
    fallback = spec.fallback
    active = fallback_active(status)
    fixed = fallback.replicas.max if active else fallback.replicas.min
    plans.append(
        TrackPlan(
            config=contract.TrackConfig(
                Track.FALLBACK,
                stable.model.version,
                fallback_batching(spec, stable.batching),
                "cpu",
                fallback.threads,
            ),
            replicas=None if fallback.scaling else fixed,
            resources=fallback.resources,
            node_selector=fallback.node_selector,
            tolerations=fallback.tolerations,
            pods=stable,
            generation=fallback_generation(spec, stable.generation_knobs),
            precision=fallback.precision,
            backend=fallback.backend,
            spread=fallback.topology_spread,
            priority_class_name=fallback.priority_class_name,
        )
    )
    return plans


def _deployment(owner: Owner, plan: TrackPlan) -> Manifest:
    track = plan.config.track
    labels = naming.labels(owner.name, track, plan.config.version)
    if plan.spec_hash is not None:
        labels[naming.SPEC_HASH_LABEL] = plan.spec_hash
    body: Manifest = {
        "selector": {"matchLabels": naming.selector(owner.name, track)},
        # No request is dropped by a rolling update: a new pod must be ready before an old
        # one goes. It needs room for one extra pod (a GPU on the GPU tracks).
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "revisionHistoryLimit": 3,
        "template": pod_template(plan, labels, naming.selector(owner.name, track)),
    }
    if plan.replicas is not None:
        body = {"replicas": plan.replicas, **body}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.metadata(naming.child_name(owner.name, track), labels),
        "spec": body,
    }


def _service(
    owner: Owner, spec: InferenceServiceSpec, name: str, selector: dict[str, str], grpc: GrpcSpec
) -> Manifest:
    """A ClusterIP Service: `http`, and `grpc` (h2c) when the pods it selects serve gRPC."""
    track = selector.get(naming.TRACK_LABEL)
    ports: list[Manifest] = [
        {"name": "http", "port": spec.traffic.port, "targetPort": "http", "protocol": "TCP"}
    ]
    if grpc.enabled:
        # A named target: a pod of the pool without the port (a canary turning gRPC off)
        # is simply no endpoint of it.
        ports.append(
            {
                "name": "grpc",
                "port": grpc.port,
                "targetPort": "grpc",
                "protocol": "TCP",
                "appProtocol": "kubernetes.io/h2c",
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(
            name, naming.labels(owner.name, Track(track) if track else None)
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": ports,
        },
    }


def traffic_weights(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> dict[Track, int]:
    """Percent of traffic per track (`rollout.traffic_split`) as the HTTPRoute lists them.

    The canary is listed while a rollout is active, the fallback whenever it is enabled
    (at 0 while the GPU tracks serve), so a failover only changes weights, never the
    rule's shape.
    """
    split = traffic_split(status)
    weights = {Track.STABLE: split.stable}
    if status.current_phase.is_rollout_active:
        weights[Track.CANARY] = split.canary
    if spec.fallback.enabled:
        weights[Track.FALLBACK] = split.fallback
    return weights


def route_matches(spec: InferenceServiceSpec) -> list[Manifest]:
    """The HTTPRoute's path matches: the inference or generation paths of the model's task."""
    # Gateway API matches a PathPrefix element by element: `/v2/models/demo` takes
    # `/v2/models/demo/infer` but not `/v2/models/demo2/infer`.
    kind, paths = (
        ("Exact", GENERATION_PATHS) if spec.model.generates else ("PathPrefix", INFERENCE_PATHS)
    )
    return [{"path": {"type": kind, "value": path.format(model=spec.model.name)}} for path in paths]


def _route(owner: Owner, spec: InferenceServiceSpec, kind: str, rule: Manifest) -> Manifest:
    """An HTTPRoute or GRPCRoute of one `rule` on the spec's Gateways and hostnames."""
    route: Manifest = {
        "parentRefs": [
            ref.model_dump(by_alias=True, exclude_none=True) for ref in spec.traffic.parent_refs
        ],
        "rules": [rule],
    }
    if spec.traffic.hostnames:
        route["hostnames"] = list(spec.traffic.hostnames)
    return {
        "apiVersion": HTTPROUTE_API_VERSION,
        "kind": kind,
        "metadata": owner.metadata(owner.name, naming.labels(owner.name)),
        "spec": route,
    }


def _http_route(owner: Owner, spec: InferenceServiceSpec, weights: dict[Track, int]) -> Manifest:
    backends = [
        {"name": naming.child_name(owner.name, track), "port": spec.traffic.port, "weight": weight}
        for track, weight in weights.items()
    ]
    # Beside the runtime's own check of the priority token: no client behind the gateway
    # reaches the pods with the priority or deadline headers, whatever token it holds (a
    # leaked token then serves only callers inside the cluster).
    strip = {
        "type": "RequestHeaderModifier",
        "requestHeaderModifier": {"remove": list(contract.PRIVILEGED_HEADERS)},
    }
    rule = {"matches": route_matches(spec), "filters": [strip], "backendRefs": backends}
    return _route(owner, spec, "HTTPRoute", rule)


def _grpc_route(
    owner: Owner,
    spec: InferenceServiceSpec,
    weights: dict[Track, int],
    grpc: dict[Track, GrpcSpec],
) -> Manifest | None:
    """The GRPCRoute: the HTTPRoute's weights, to the `grpc` port of each track serving it.

    A track whose pods do not serve gRPC (the stable track while a canary turns it on) is
    left out rather than listed at its weight, since every call sent to it would fail. None
    when no track serves gRPC.
    """
    backends = [
        {"name": naming.child_name(owner.name, track), "port": grpc[track].port, "weight": weight}
        for track, weight in weights.items()
        if grpc[track].enabled
    ]
    if not backends:
        return None
    matches = [{"method": {"type": "Exact", "service": GRPC_SERVICE}}]
    return _route(owner, spec, "GRPCRoute", {"matches": matches, "backendRefs": backends})


def _track_scaling(
    spec: InferenceServiceSpec, track: Track
) -> tuple[ScalingSpec | None, DisruptionSpec]:
    """The autoscaling (None: sized by the operator) and disruption budget of `track`."""
    if track is Track.FALLBACK:
        return spec.fallback.scaling, spec.fallback.disruption
    return (spec.scaling if track is Track.STABLE else None), spec.disruption


def _scaling_children(
    owner: Owner,
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    plans: list[TrackPlan],
    *,
    observed_stable_replicas: int,
    prometheus_url: str | None,
) -> list[Manifest]:
    """Each track's ScaledObject (when autoscaled) and PodDisruptionBudget (when it has one).

    While a rollout is active the stable track's scaler may grow it but not shrink it below
    its observed size: the canary is sized from it, and during promotion the stable track
    carries no traffic, so an idle-looking signal would otherwise scale it down just before
    it takes all traffic back.
    """
    children: list[Manifest] = []
    for plan in plans:
        track = plan.config.track
        name = naming.child_name(owner.name, track)
        labels = naming.labels(owner.name, track)
        autoscaling, disruption = _track_scaling(spec, track)
        if autoscaling is not None:
            query = scaling.scaling_query(
                autoscaling.metric, namespace=owner.namespace, model=spec.model.name, track=track
            )
            holding = track is Track.STABLE and status.current_phase.is_rollout_active
            children.append(
                scaling.scaled_object(
                    owner.metadata(name, labels),
                    name,
                    autoscaling,
                    query=query,
                    prometheus_url=prometheus_url,
                    floor=observed_stable_replicas if holding else 0,
                )
            )
        if scaling.needs_budget(plan.replicas):
            selector = naming.selector(owner.name, track)
            children.append(
                scaling.disruption_budget(owner.metadata(name, labels), selector, disruption)
            )
    return children


def desired_children(
    owner: Owner,
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    *,
    observed_stable_replicas: int = 0,
    prometheus_url: str | None = None,
) -> list[Manifest]:
    """Every child object the service needs in `status`, in apply order (Deployments first).

    `prometheus_url` is where a ScaledObject's trigger reads the runtime's metrics.
    """
    plans = plan_tracks(spec, status, observed_stable_replicas=observed_stable_replicas)
    children = [_deployment(owner, plan) for plan in plans]
    children += _scaling_children(
        owner,
        spec,
        status,
        plans,
        observed_stable_replicas=observed_stable_replicas,
        prometheus_url=prometheus_url,
    )
    grpc = {plan.config.track: plan.pods.runtime.grpc for plan in plans}
    for plan in plans:
        track = plan.config.track
        children.append(
            _service(
                owner,
                spec,
                naming.child_name(owner.name, track),
                naming.selector(owner.name, track),
                grpc[track],
            )
        )
    pool = Track.FALLBACK.pool if fallback_active(status) else Track.STABLE.pool
    umbrella = {
        naming.NAME_LABEL: naming.APP_NAME,
        naming.INSTANCE_LABEL: owner.name,
        naming.POOL_LABEL: pool,
    }
    # The fallback runs the stable track's pods, so both pools serve gRPC as stable does.
    children.append(_service(owner, spec, owner.name, umbrella, grpc[Track.STABLE]))
    if spec.traffic.provider is TrafficProvider.GATEWAY_API:
        weights = traffic_weights(spec, status)
        children.append(_http_route(owner, spec, weights))
        grpc_route = _grpc_route(owner, spec, weights, grpc)
        if grpc_route is not None:
            children.append(grpc_route)
    return [_with_applied_hash(child) for child in children]


def _with_applied_hash(child: Manifest) -> Manifest:
    digest = hashlib.sha256(json.dumps(child, sort_keys=True).encode()).hexdigest()[:16]
    child["metadata"]["annotations"] = {APPLIED_HASH_ANNOTATION: digest}
    return child


def child_key(manifest: Manifest) -> tuple[str, str]:
    """(kind, name): what identifies a child within its namespace."""
    return manifest["kind"], manifest["metadata"]["name"]


def is_drifted(desired: Any, observed: Any) -> bool:
    """True when `observed` lacks or changed a field of `desired` (extra fields are fine)."""
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return True
        return any(is_drifted(value, observed.get(key)) for key, value in desired.items())
    if isinstance(desired, list):
        if not isinstance(observed, list) or len(desired) != len(observed):
            return True
        return any(is_drifted(d, o) for d, o in zip(desired, observed, strict=True))
    # Quantities come back as strings ("2" for 2); compare them as the API prints them.
    return str(desired) != str(observed)


def is_controlled_by(owner: Owner, obj: Manifest) -> bool:
    """True when `obj` carries `owner`'s controller reference (labels alone prove nothing)."""
    return any(
        ref.get("uid") == owner.uid and ref.get("controller") is True
        for ref in obj["metadata"].get("ownerReferences") or []
    )


def _is_applied_by_operator(obj: Manifest) -> bool:
    """True when the operator's field manager owns `obj`'s fields through server-side apply."""
    return any(
        entry.get("manager") == naming.MANAGER and entry.get("operation") == "Apply"
        for entry in obj["metadata"].get("managedFields") or []
    )


def needs_write(desired: Manifest, observed: Manifest) -> bool:
    """True when `observed` drifted from `desired`, or the operator does not own its fields yet.

    The latter is a child created but not yet server-side applied (the operator stopped in
    between): until it is applied, a field later dropped from `desired` would stay behind.
    """
    return is_drifted(desired, observed) or not _is_applied_by_operator(observed)


_ROUTE_KINDS = frozenset({"HTTPRoute", "GRPCRoute"})


def _drops_port(desired: Manifest, current: Manifest | None) -> bool:
    """True when `desired` applied over the Service `current` takes away one of its ports."""
    if current is None or desired["kind"] != "Service":
        return False
    kept = {port["port"] for port in desired["spec"]["ports"]}
    return any(port.get("port") not in kept for port in current["spec"].get("ports") or [])


def converge_phase(child: Manifest, current: Manifest | None, *, stale: bool = False) -> int:
    """When a converge writes `child` over `current`, or deletes it (`stale`): lowest first.

    A route may only name what is there, at every moment and whichever write the operator
    dies after: whatever a route is about to name is written before the routes (0), and
    whatever routes stop naming is changed or removed after them (3, 4). So a promotion
    moves the routes to the stable track before the canary goes, and a Service loses a
    port (the GRPCRoute's, when a version stops serving gRPC) only once no route names it.

    0: creates and applies that add or keep (Deployments, Services keeping every port,
    scalers, budgets); 1: routes written; 2: routes deleted; 3: Services losing a port;
    4: every other deletion.
    """
    route = child["kind"] in _ROUTE_KINDS
    if stale:
        return 2 if route else 4
    if route:
        return 1
    return 3 if _drops_port(child, current) else 0


def stale_children(
    owner: Owner, desired: list[Manifest], observed: list[Manifest]
) -> list[Manifest]:
    """Observed children this owner controls that are no longer desired (e.g. fallback off)."""
    wanted = {child_key(child) for child in desired}
    return [
        child
        for child in observed
        if child_key(child) not in wanted and is_controlled_by(owner, child)
    ]
