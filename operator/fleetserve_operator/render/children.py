"""Pure: an InferenceService's spec and status → the child objects it needs.

`sync` calls `desired_children` and writes the result through `kube` (create-only for new
children, server-side apply for the operator's own); nothing here talks to the cluster. Children
are plain dicts in the API's own shape, carrying only the fields the operator owns (server-side
apply leaves every other field to its owner). Every track `tracks.plan_tracks` plans gets a
Deployment and a Service; an autoscaled track's Deployment leaves its replica count to the HPA
of the KEDA ScaledObject rendered beside it, and a track of 2 or more replicas (or autoscaled)
gets a PodDisruptionBudget (both from `scaling`). When a track's pods serve gRPC
(`spec.runtime.grpc`) its Service gains an h2c `grpc` port. With `gateway-api`, the routes
come from `routes`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fleetserve_operator import contract, naming
from fleetserve_operator.naming import Track
from fleetserve_operator.records import Manifest
from fleetserve_operator.render import routes, scaling
from fleetserve_operator.render.owner import Owner
from fleetserve_operator.render.pods import TrackPlan, pod_template
from fleetserve_operator.render.tracks import plan_tracks
from fleetserve_operator.rollout import canary_only, fallback_active, stable_only
from fleetserve_operator.spec import (
    ConditionType,
    DisruptionSpec,
    GrpcSpec,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutPhase,
    ScalingSpec,
    TracksStatus,
    TrafficProvider,
)

__all__ = ["APPLIED_HASH_ANNOTATION", "desired_children", "rendered_status"]

APPLIED_HASH_ANNOTATION = f"{naming.GROUP}/applied-hash"
"""A hash of everything the operator applies to a child, so that a field the spec no longer
asks for (a hostname, a node selector entry) is a drift too: `converge.is_drifted` alone only sees
desired fields that are missing or different, never ones that should be gone."""


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
        "template": pod_template(
            plan,
            labels,
            naming.selector(owner.name, track),
            shadow_target=naming.shadow_target_name(owner.name),
        ),
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


_REPORTED: dict[str, Any] = {
    "observed_generation": None,
    "effective_canary_weight": 0,
    "ready": None,
    "tracks": TracksStatus(),
    "last_error": None,
    "last_transition_time": None,
}
"""The fields of a status that report what the pods and the cluster did, and their defaults:
no child is rendered from them (conditions are dealt with apart)."""


def rendered_status(status: InferenceServiceStatus) -> InferenceServiceStatus:
    """`status` without what it reports, the part the children are rendered from.

    The ready counts, the track statuses, the conditions and the last error change on
    nearly every reconcile while a service comes up and never change a child, so two
    statuses alike here render the same children: `sync` keeps the last rendering by this
    view. The phase, the canary's version and weight, the rollout's state and the
    `FallbackActive` condition stay. `desired_children` renders from this view alone, so a
    field it leaves out cannot be read by mistake.
    """
    fallback = status.condition(ConditionType.FALLBACK_ACTIVE)
    conditions = [] if fallback is None else [fallback]
    return status.model_copy(update={**_REPORTED, "conditions": conditions})


def desired_children(
    owner: Owner,
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    *,
    observed_stable_replicas: int = 0,
    prometheus_url: str | None = None,
) -> list[Manifest]:
    """Every child object the service needs in `status`, in apply order (Deployments first).

    Only `rendered_status(status)` is read. `prometheus_url` is where a ScaledObject's
    trigger reads the runtime's metrics.
    """
    status = rendered_status(status)
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
    umbrella_grpc = grpc[Track.STABLE]
    if stable_only(spec, status):
        # Before and during a shadow stage the canary answers only the stable pods' copies,
        # through its own Service (with `replicas` traffic, every client reaches this one).
        umbrella = naming.selector(owner.name, Track.STABLE)
    if canary_only(spec, status):
        # The bake's standby: its pods keep running but must answer nothing, whatever
        # reaches the umbrella Service (with `replicas` traffic, every client).
        umbrella, umbrella_grpc = naming.selector(owner.name, Track.CANARY), grpc[Track.CANARY]
    # The fallback runs the stable track's pods, so both pools serve gRPC as stable does.
    children.append(_service(owner, spec, owner.name, umbrella, umbrella_grpc))
    if spec.rollout.shadow is not None:
        children.append(_shadow_target(owner, spec, status))
    if spec.traffic.provider is TrafficProvider.GATEWAY_API:
        weights = routes.traffic_weights(spec, status)
        children.append(routes.http_route(owner, spec, weights))
        grpc_route = routes.grpc_route(owner, spec, weights, grpc)
        if grpc_route is not None:
            children.append(grpc_route)
    return [_with_applied_hash(child) for child in children]


def _shadow_target(
    owner: Owner, spec: InferenceServiceSpec, status: InferenceServiceStatus
) -> Manifest:
    """The ConfigMap the stable pods follow: the canary's Service while shadowing, else empty.

    Present whenever `rollout.shadow` is set, so that a stage's start and end are edits of
    one file the pods re-read; empty (no target) outside the stage, so leaving it by any
    row stops the copies.
    """
    target = ""
    shadow = spec.rollout.shadow
    if shadow is not None and status.current_phase is RolloutPhase.SHADOWING:
        scheme = "https" if spec.runtime.tls is not None else "http"
        service = naming.child_name(owner.name, Track.CANARY)
        url = f"{scheme}://{service}.{owner.namespace}.svc:{spec.traffic.port}"
        target = contract.shadow_target(url, shadow, status.canary_version or spec.model.version)
    name = naming.shadow_target_name(owner.name)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owner.metadata(name, naming.labels(owner.name)),
        "data": {contract.SHADOW_TARGET_KEY: target},
    }


def _with_applied_hash(child: Manifest) -> Manifest:
    digest = hashlib.sha256(json.dumps(child, sort_keys=True).encode()).hexdigest()[:16]
    child["metadata"]["annotations"] = {APPLIED_HASH_ANNOTATION: digest}
    return child
