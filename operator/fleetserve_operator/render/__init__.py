"""Rendering: an InferenceService's spec and status → the child objects it needs.

Pure: nothing here talks to the cluster. `sync` calls `desired_children` and writes the
result through `kube`; the children are plain dicts in the API's own shape, carrying only
the fields the operator owns. Modules, highest first (a module imports only those below it;
`|`: independent):

    children    the Deployments, Services and routes of every track, and how a desired child
                compares with the observed one (drift, ownership, the order of writes)
    pods        a track's pod template and the runtime's command line
    scaling     KEDA ScaledObjects, PodDisruptionBudgets and topology spread

This package re-exports what the rest of the operator and the tests use.
"""

from __future__ import annotations

from fleetserve_operator.render.children import (
    APPLIED_HASH_ANNOTATION,
    GENERATION_PATHS,
    GRPC_SERVICE,
    HTTPROUTE_API_VERSION,
    INFERENCE_PATHS,
    Owner,
    check_semantics,
    child_key,
    converge_phase,
    desired_children,
    fallback_generation,
    is_controlled_by,
    is_drifted,
    needs_write,
    plan_tracks,
    route_matches,
    stable_pods,
    stale_children,
    traffic_weights,
)
from fleetserve_operator.render.pods import TrackPlan, pod_template, runtime_args

__all__ = [
    "APPLIED_HASH_ANNOTATION",
    "GENERATION_PATHS",
    "GRPC_SERVICE",
    "HTTPROUTE_API_VERSION",
    "INFERENCE_PATHS",
    "Owner",
    "TrackPlan",
    "check_semantics",
    "child_key",
    "converge_phase",
    "desired_children",
    "fallback_generation",
    "is_controlled_by",
    "is_drifted",
    "needs_write",
    "plan_tracks",
    "pod_template",
    "route_matches",
    "runtime_args",
    "stable_pods",
    "stale_children",
    "traffic_weights",
]
