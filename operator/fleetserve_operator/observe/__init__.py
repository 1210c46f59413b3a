"""Observing: what the cluster and Prometheus report → status, conditions, Events and facts.

Pure: `sync` gathers the observations through `kube` and `analysis` and hands them here.
Modules, highest first (a module imports only those below it):

    facts       the tracks' Deployments and pods → the rollout's `TrackFacts`, the model
                fetches of their pods (`track_fetches`), and the failures after the
                children were applied (`workload_problem`); what of one Deployment's or
                pod's status they read (`deployment_reading`, `pod_reading`, by kind
                `STATUS_READINGS`)
    status      the observed children, problems and measured memory → `.status`, its
                conditions, the notes of a status change and a reconcile's Events

This package re-exports what the rest of the operator and the tests use.
"""

from __future__ import annotations

from fleetserve_operator.observe.facts import (
    STATUS_READINGS,
    deployment_reading,
    pod_reading,
    track_facts,
    track_fetches,
    workload_problem,
)
from fleetserve_operator.observe.status import (
    Observation,
    compute_status,
    effective_canary_weight,
    generation_memory_problem,
    is_rolled_out,
    memory_problem,
    reconcile_events,
    track_status,
    transitions,
)

__all__ = [
    "STATUS_READINGS",
    "Observation",
    "compute_status",
    "deployment_reading",
    "effective_canary_weight",
    "generation_memory_problem",
    "is_rolled_out",
    "memory_problem",
    "pod_reading",
    "reconcile_events",
    "track_facts",
    "track_fetches",
    "track_status",
    "transitions",
    "workload_problem",
]
