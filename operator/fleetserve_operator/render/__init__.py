"""Rendering: an InferenceService's spec and status → the child objects it needs.

Pure: nothing here talks to the cluster. `sync` calls `desired_children` and writes the
result through `kube`, in `converge_phase` order; the children are plain dicts in the API's
own shape, carrying only the fields the operator owns. Modules, highest first (a module
imports only those below it; `|`: independent):

    children | converge   every child of the service (Deployments, Services, scalers,
                          budgets, routes); how the desired children meet the observed ones
                          (drift, ownership, stale children, the order of writes)
    routes | tracks       the HTTPRoute and GRPCRoute and their weights; the tracks to run
                          now (`TrackPlan`s) and what the schema cannot check
    pods                  a track's pod template and the runtime's command line
    scaling | owner       KEDA ScaledObjects, PodDisruptionBudgets and topology spread; the
                          InferenceService whose children these are

This package re-exports what the rest of the operator and the tests use.
"""

from __future__ import annotations

from fleetserve_operator.render.children import (
    APPLIED_HASH_ANNOTATION,
    desired_children,
    rendered_status,
)
from fleetserve_operator.render.converge import (
    PODS_PHASE,
    child_key,
    converge_phase,
    first_create_phase,
    is_controlled_by,
    is_drifted,
    needs_write,
    stale_children,
)
from fleetserve_operator.render.owner import Owner
from fleetserve_operator.render.pods import TrackPlan, pod_template, runtime_args
from fleetserve_operator.render.routes import (
    GENERATION_PATHS,
    GRPC_SERVICE,
    HTTPROUTE_API_VERSION,
    INFERENCE_PATHS,
    route_matches,
    traffic_weights,
)
from fleetserve_operator.render.tracks import (
    check_semantics,
    fallback_generation,
    plan_tracks,
    stable_pods,
)

__all__ = [
    "APPLIED_HASH_ANNOTATION",
    "GENERATION_PATHS",
    "GRPC_SERVICE",
    "HTTPROUTE_API_VERSION",
    "INFERENCE_PATHS",
    "PODS_PHASE",
    "Owner",
    "TrackPlan",
    "check_semantics",
    "child_key",
    "converge_phase",
    "desired_children",
    "fallback_generation",
    "first_create_phase",
    "is_controlled_by",
    "is_drifted",
    "needs_write",
    "plan_tracks",
    "pod_template",
    "rendered_status",
    "route_matches",
    "runtime_args",
    "stable_pods",
    "stale_children",
    "traffic_weights",
]
