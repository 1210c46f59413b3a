"""Pure: the HTTPRoute and GRPCRoute of a service, and the weights they give each track.

HTTPRoute weights follow `rollout.traffic_split`. The HTTPRoute exposes only the inference
paths of the model's task (`INFERENCE_PATHS` for an encoder, `GENERATION_PATHS` for a
generative model), never the runtime's admin endpoints. When a track's pods serve gRPC
(`spec.runtime.grpc`), a GRPCRoute beside the HTTPRoute sends
`inference.GRPCInferenceService` calls to the same tracks with the same weights.
"""

from __future__ import annotations

from fleetserve_operator import contract, naming
from fleetserve_operator.naming import Track
from fleetserve_operator.records import Manifest
from fleetserve_operator.render.owner import Owner
from fleetserve_operator.rollout import traffic_split
from fleetserve_operator.spec import GrpcSpec, InferenceServiceSpec, InferenceServiceStatus

__all__ = [
    "GENERATION_PATHS",
    "GRPC_SERVICE",
    "HTTPROUTE_API_VERSION",
    "INFERENCE_PATHS",
    "grpc_route",
    "http_route",
    "route_matches",
    "traffic_weights",
]

HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
GRPC_SERVICE = "inference.GRPCInferenceService"
"""The one gRPC service the GRPCRoute sends to the runtime (the inference RPCs only: the
runtime serves no model control over gRPC)."""
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


def http_route(owner: Owner, spec: InferenceServiceSpec, weights: dict[Track, int]) -> Manifest:
    """The HTTPRoute: the inference paths of the model's task, to each track at its weight."""
    backends = [
        {"name": naming.child_name(owner.name, track), "port": spec.traffic.port, "weight": weight}
        for track, weight in weights.items()
    ]
    # Beside the runtime's own check of the priority token: no client behind the gateway
    # reaches the pods with the priority or deadline headers, whatever token it holds (a
    # leaked token then serves only callers inside the cluster). The tenant header, too,
    # unless the service says the gateway in front sets it.
    tenants = spec.runtime.tenants
    removed = list(contract.PRIVILEGED_HEADERS)
    if tenants is None or not tenants.trust_header:
        removed.append(contract.TENANT_HEADER)
    strip = {"type": "RequestHeaderModifier", "requestHeaderModifier": {"remove": removed}}
    rule = {"matches": route_matches(spec), "filters": [strip], "backendRefs": backends}
    return _route(owner, spec, "HTTPRoute", rule)


def grpc_route(
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
