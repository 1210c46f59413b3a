"""Pure: the autoscaling and disruption children of one track, and its spreading constraints.

`children` calls these for every track it plans. An autoscaled track (`spec.scaling`,
`spec.fallback.scaling`) gets a KEDA `ScaledObject` whose single Prometheus trigger reads the
runtime's own metric for that service and track, selected exactly as the rollout analysis
selects a track (`namespace`, `model`, `track`; no `version`, so the query follows the track
through a promotion). KEDA creates the HorizontalPodAutoscaler that then owns the
Deployment's replica count, and the operator leaves `spec.replicas` out of the Deployment it
applies so that server-side apply never resets it.

A track that runs 2 or more replicas, or is autoscaled, gets a `PodDisruptionBudget`; a
budget on a single replica protects nothing or blocks every drain.
"""

from __future__ import annotations

from decimal import Decimal

from fleetserve_operator import contract
from fleetserve_operator.errors import DependencyMissing
from fleetserve_operator.naming import Track
from fleetserve_operator.records import Manifest
from fleetserve_operator.spec import DisruptionSpec, ScalingMetric, ScalingSpec, TopologySpread

__all__ = [
    "HOSTNAME_KEY",
    "INFLIGHT_METRIC",
    "KV_CACHE_USAGE_METRIC",
    "PDB_API_VERSION",
    "QUEUE_WAIT_QUANTILE",
    "QUEUE_WAIT_WINDOW",
    "SCALED_OBJECT_API_VERSION",
    "ZONE_KEY",
    "disruption_budget",
    "needs_budget",
    "scaled_object",
    "scaling_query",
    "topology_spread",
]

SCALED_OBJECT_API_VERSION = "keda.sh/v1alpha1"
PDB_API_VERSION = "policy/v1"
INFLIGHT_METRIC = "fleetserve_inflight_requests"
"""Requests accepted and not yet answered, a gauge per pod labelled model/track."""
KV_CACHE_USAGE_METRIC = "fleetserve_kv_cache_usage_ratio"
"""Share of the KV cache held by sequences, a gauge per pod labelled model/version/track."""
QUEUE_WAIT_QUANTILE = 0.9
QUEUE_WAIT_WINDOW = "1m"
"""The rate window of the queue-wait p90: four scrapes at Prometheus' usual 15 s."""
HOSTNAME_KEY = "kubernetes.io/hostname"
ZONE_KEY = "topology.kubernetes.io/zone"


def _selector(namespace: str, model: str, track: Track) -> str:
    return f'namespace="{namespace}",model="{model}",track="{track}"'


def scaling_query(metric: ScalingMetric, *, namespace: str, model: str, track: Track) -> str:
    """The PromQL the trigger reads: a track total (per-replica metrics) or its p90.

    Every query falls back to 0 when the track has no series yet (no replica scraped, no
    request in the window: a quantile of nothing is NaN), so KEDA reads "idle", not an error.
    """
    selector = _selector(namespace, model, track)
    if metric is ScalingMetric.QUEUE_WAIT_P90:
        rate = f"rate({contract.QUEUE_WAIT_METRIC}_bucket{{{selector}}}[{QUEUE_WAIT_WINDOW}])"
        value = f"histogram_quantile({QUEUE_WAIT_QUANTILE}, sum by (le) ({rate})) > 0"
    else:
        name = (
            INFLIGHT_METRIC if metric is ScalingMetric.INFLIGHT_REQUESTS else KV_CACHE_USAGE_METRIC
        )
        value = f"sum({name}{{{selector}}})"
    return f"({value}) or vector(0)"


def scaled_object(
    metadata: Manifest,
    deployment: str,
    scaling: ScalingSpec,
    *,
    query: str,
    prometheus_url: str | None,
    floor: int = 0,
) -> Manifest:
    """The ScaledObject that scales Deployment `deployment` by `scaling`.

    `floor` raises the minimum while the operator needs the track to keep its size (the
    stable track during a rollout, see `tracks.plan_tracks`), capped at the maximum.

    Raises:
        DependencyMissing: no Prometheus to read (`prometheus_url` None), naming spec.scaling.
    """
    if prometheus_url is None:
        msg = (
            "autoscaling reads the runtime's metrics from Prometheus: set "
            "spec.rollout.analysis.prometheusUrl, or the operator's prometheus URL"
        )
        raise DependencyMissing("spec.scaling", msg)
    windows = {
        "scaleUp": {"stabilizationWindowSeconds": scaling.scale_up_window_seconds},
        "scaleDown": {"stabilizationWindowSeconds": scaling.scale_down_window_seconds},
    }
    return {
        "apiVersion": SCALED_OBJECT_API_VERSION,
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
            "minReplicaCount": min(max(scaling.min_replicas, floor), scaling.max_replicas),
            "maxReplicaCount": scaling.max_replicas,
            "pollingInterval": scaling.polling_interval_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": windows}},
            "triggers": [_prometheus_trigger(scaling, query=query, prometheus_url=prometheus_url)],
        },
    }


def _prometheus_trigger(scaling: ScalingSpec, *, query: str, prometheus_url: str) -> Manifest:
    """The ScaledObject's one trigger: `query` on Prometheus, against `scaling.target`."""
    # A per-replica signal is divided by the replica count (AverageValue); a quantile is the
    # track's already, so the HPA grows the track in proportion to value / target (Value).
    per_replica = scaling.metric is not ScalingMetric.QUEUE_WAIT_P90
    return {
        "type": "prometheus",
        "metricType": "AverageValue" if per_replica else "Value",
        "metadata": {
            "serverAddress": prometheus_url,
            "query": query,
            "threshold": _plain(scaling.target),
        },
    }


def _plain(value: float) -> str:
    """`value` as KEDA's string-only trigger metadata takes it: no exponent, no trailing 0."""
    return format(Decimal(repr(value)).normalize(), "f")


def needs_budget(replicas: int | None) -> bool:
    """True when a track of `replicas` (None: autoscaled) gets a PodDisruptionBudget."""
    return replicas is None or replicas >= 2


def disruption_budget(
    metadata: Manifest, selector: dict[str, str], disruption: DisruptionSpec
) -> Manifest:
    """The PodDisruptionBudget of the pods `selector` matches."""
    return {
        "apiVersion": PDB_API_VERSION,
        "kind": "PodDisruptionBudget",
        "metadata": metadata,
        "spec": {
            "maxUnavailable": disruption.max_unavailable,
            "selector": {"matchLabels": dict(selector)},
        },
    }


def topology_spread(selector: dict[str, str], mode: TopologySpread) -> list[Manifest]:
    """Pod topology spread constraints over nodes, then zones; empty when `mode` is Off."""
    if mode is TopologySpread.OFF:
        return []
    # Zones stay best-effort whatever the mode: under DoNotSchedule a node without the zone
    # label would take no pod, and many clusters (and single-zone ones) have none.
    keys = ((HOSTNAME_KEY, mode.value), (ZONE_KEY, TopologySpread.SCHEDULE_ANYWAY.value))
    return [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": dict(selector)},
        }
        for key, when in keys
    ]
