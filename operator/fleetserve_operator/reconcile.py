"""Pure reconciliation: an InferenceService's spec and status → the child objects it needs.

`handlers` calls `desired_children` and hands the result to `kube` for server-side apply;
nothing here talks to the cluster. Children are plain dicts in the API's own shape, carrying
only the fields the operator owns (server-side apply leaves every other field to its owner).
The canary Deployment is the rollout's (issue 5): it appears here only while a rollout is
active, from `status`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fleetserve_operator import contract, naming
from fleetserve_operator.errors import InvalidSpec
from fleetserve_operator.naming import Track
from fleetserve_operator.podspec import pod_template
from fleetserve_operator.spec import (
    BatchingSpec,
    ConditionType,
    InferenceServiceSpec,
    InferenceServiceStatus,
    Resources,
    Toleration,
)

__all__ = [
    "HTTPROUTE_API_VERSION",
    "Owner",
    "TrackPlan",
    "check_semantics",
    "child_key",
    "desired_children",
    "is_drifted",
    "plan_tracks",
    "stale_children",
    "traffic_weights",
]

Manifest = dict[str, Any]
HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_MAX_NAME = 63 - len("-fallback")


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


@dataclass(frozen=True, slots=True)
class TrackPlan:
    """What one track's Deployment runs; `replicas` None leaves the count to an autoscaler."""

    config: contract.TrackConfig
    replicas: int | None
    resources: Resources
    node_selector: dict[str, str]
    tolerations: list[Toleration]


def check_semantics(owner: Owner, spec: InferenceServiceSpec) -> None:
    """Reject what the schema lets through but no cluster can run.

    Raises:
        InvalidSpec: naming the field at fault.
    """
    if len(owner.name) > _MAX_NAME or _DNS_1035.match(owner.name) is None:
        msg = f"must be a DNS-1035 label of at most {_MAX_NAME} characters, got {owner.name!r}"
        raise InvalidSpec("metadata.name", msg)
    uri = spec.model.uri or ""
    if uri.startswith("builtin://"):
        kind = uri.removeprefix("builtin://").split("?", 1)[0]
        if kind not in contract.KNOWN_BUILTINS:
            known = ", ".join(sorted(contract.KNOWN_BUILTINS))
            raise InvalidSpec("spec.model.uri", f"unknown builtin model {kind!r}; known: {known}")
    fallback_batching(spec)


def fallback_batching(spec: InferenceServiceSpec) -> BatchingSpec:
    """The fallback's batching: `spec.batching` with `spec.fallback.batching` laid over it."""
    try:
        return spec.fallback.batching.merged_over(spec.batching)
    except ValueError as exc:
        raise InvalidSpec("spec.fallback.batching", str(exc)) from None


def _fallback_active(status: InferenceServiceStatus) -> bool:
    condition = status.condition(ConditionType.FALLBACK_ACTIVE)
    return condition is not None and condition.is_true


def plan_tracks(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> list[TrackPlan]:
    """The tracks to run: stable always, fallback when enabled (grown to max while active)."""
    runtime = spec.runtime
    stable = TrackPlan(
        config=contract.TrackConfig(
            Track.STABLE, spec.model.version, spec.batching, runtime.device, runtime.threads
        ),
        replicas=None if runtime.replicas.is_autoscaled else runtime.replicas.min,
        resources=runtime.resources,
        node_selector=runtime.node_selector,
        tolerations=runtime.tolerations,
    )
    if not spec.fallback.enabled:
        return [stable]
    fallback = spec.fallback
    active = _fallback_active(status)
    return [
        stable,
        TrackPlan(
            config=contract.TrackConfig(
                Track.FALLBACK, spec.model.version, fallback_batching(spec), "cpu", fallback.threads
            ),
            replicas=fallback.replicas.max if active else fallback.replicas.min,
            resources=fallback.resources,
            node_selector=fallback.node_selector,
            tolerations=fallback.tolerations,
        ),
    ]


def _deployment(owner: Owner, spec: InferenceServiceSpec, plan: TrackPlan) -> Manifest:
    track = plan.config.track
    body: Manifest = {
        "selector": {"matchLabels": naming.selector(owner.name, track)},
        # No request is dropped by a rolling update: a new pod must be ready before an old
        # one goes. It needs room for one extra pod (a GPU on the GPU tracks).
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "revisionHistoryLimit": 3,
        "template": pod_template(owner.name, spec, plan),
    }
    if plan.replicas is not None:
        body = {"replicas": plan.replicas, **body}
    labels = naming.labels(owner.name, track, plan.config.version)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.metadata(naming.child_name(owner.name, track), labels),
        "spec": body,
    }


def _service(
    owner: Owner, spec: InferenceServiceSpec, name: str, selector: dict[str, str]
) -> Manifest:
    track = selector.get(naming.TRACK_LABEL)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(
            name, naming.labels(owner.name, Track(track) if track else None)
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {"name": "http", "port": spec.traffic.port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def traffic_weights(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> dict[Track, int]:
    """Percent of traffic per track: all to stable unless a rollout or a failover says else."""
    if _fallback_active(status):
        return {Track.STABLE: 0, Track.FALLBACK: 100}
    canary = status.canary_weight if status.phase and status.phase.is_rollout_active else 0
    weights = {Track.STABLE: 100 - canary}
    if status.phase and status.phase.is_rollout_active:
        weights[Track.CANARY] = canary
    if spec.fallback.enabled:
        # Listed at weight 0 so that a failover only changes weights, never the rule's shape.
        weights[Track.FALLBACK] = 0
    return weights


def _http_route(owner: Owner, spec: InferenceServiceSpec, weights: dict[Track, int]) -> Manifest:
    route: Manifest = {
        "parentRefs": [
            ref.model_dump(by_alias=True, exclude_none=True) for ref in spec.traffic.parent_refs
        ],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [
                    {
                        "name": naming.child_name(owner.name, track),
                        "port": spec.traffic.port,
                        "weight": weight,
                    }
                    for track, weight in weights.items()
                ],
            }
        ],
    }
    if spec.traffic.hostnames:
        route["hostnames"] = list(spec.traffic.hostnames)
    return {
        "apiVersion": HTTPROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": owner.metadata(owner.name, naming.labels(owner.name)),
        "spec": route,
    }


def desired_children(
    owner: Owner, spec: InferenceServiceSpec, status: InferenceServiceStatus
) -> list[Manifest]:
    """Every child object the service needs now, in apply order (Deployments first)."""
    plans = plan_tracks(spec, status)
    children = [_deployment(owner, spec, plan) for plan in plans]
    for plan in plans:
        track = plan.config.track
        children.append(
            _service(
                owner,
                spec,
                naming.child_name(owner.name, track),
                naming.selector(owner.name, track),
            )
        )
    pool = Track.FALLBACK.pool if _fallback_active(status) else Track.STABLE.pool
    umbrella = {
        naming.NAME_LABEL: naming.APP_NAME,
        naming.INSTANCE_LABEL: owner.name,
        naming.POOL_LABEL: pool,
    }
    children.append(_service(owner, spec, owner.name, umbrella))
    if spec.traffic.provider == "gateway-api":
        children.append(_http_route(owner, spec, traffic_weights(spec, status)))
    return children


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


def stale_children(
    owner: Owner, desired: list[Manifest], observed: list[Manifest]
) -> list[Manifest]:
    """Observed children this owner controls that are no longer desired (e.g. fallback off)."""
    wanted = {child_key(child) for child in desired}
    return [
        child
        for child in observed
        if child_key(child) not in wanted
        and any(ref.get("uid") == owner.uid for ref in child["metadata"].get("ownerReferences", []))
    ]
