"""The operator's own Prometheus metrics (`fleetserve_operator_*`), served by `__main__`.

`sync` counts every reconcile by trigger and outcome, times it, and counts the writes it
makes, so a restarted operator that writes nothing can be seen to write nothing. It also
counts the rollouts' rollbacks and promotions when a transition asks it to, and exports
each InferenceService's reported status (phase, canary weight, conditions, versions) as
gauges, so alerts and dashboards need no kube-state-metrics config; `handlers` forgets a
service's gauges when it is deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from fleetserve_operator.rollout import OperatorCounter
from fleetserve_operator.spec import Condition, InferenceServiceStatus, RolloutPhase

__all__ = [
    "CANARY_WEIGHT",
    "COALESCED",
    "CONDITION",
    "EFFECTIVE_CANARY_WEIGHT",
    "INFO",
    "PHASE",
    "GaugeSample",
    "OperatorMetrics",
    "ServiceGauge",
    "status_samples",
]

COALESCED = "coalesced"
"""The `result` of a reconcile a child event asked for while one was already queued: it merged
into that one and never ran on its own."""
_CONDITION_STATUSES: tuple[str, ...] = get_args(Condition.model_fields["status"].annotation)


@dataclass(frozen=True, slots=True)
class ServiceGauge:
    """A gauge with one series set per InferenceService, labelled `namespace` and `name`."""

    name: str
    documentation: str
    labels: tuple[str, ...]
    """Labels besides `namespace` and `name`."""


PHASE = ServiceGauge(
    "fleetserve_operator_inferenceservice_phase",
    "status.phase as a state set: 1 for the current phase, 0 for every other RolloutPhase.",
    ("phase",),
)
CANARY_WEIGHT = ServiceGauge(
    "fleetserve_operator_canary_weight_percent",
    "status.canaryWeight: the rollout step's percentage for the canary (0 without one).",
    (),
)
EFFECTIVE_CANARY_WEIGHT = ServiceGauge(
    "fleetserve_operator_effective_canary_weight_percent",
    "status.effectiveCanaryWeight: the canary's real share (replica ratio without a route).",
    (),
)
CONDITION = ServiceGauge(
    "fleetserve_operator_inferenceservice_condition",
    "status.conditions as a state set: 1 for the condition's status, 0 for the other two.",
    ("condition", "status"),
)
INFO = ServiceGauge(
    "fleetserve_operator_inferenceservice_info",
    "Always 1; status.stableVersion and status.canaryVersion ('' without a canary).",
    ("stable_version", "canary_version"),
)
_SERVICE_GAUGES = (PHASE, CANARY_WEIGHT, EFFECTIVE_CANARY_WEIGHT, CONDITION, INFO)


@dataclass(frozen=True, slots=True)
class GaugeSample:
    """One sample of a `ServiceGauge` for one InferenceService."""

    gauge: ServiceGauge
    labels: Mapping[str, str]
    """A value for each of `gauge.labels`."""
    value: float


def status_samples(status: InferenceServiceStatus) -> list[GaugeSample]:
    """The gauge samples that describe `status` (no phase yet: every phase 0)."""
    samples = [
        GaugeSample(PHASE, {"phase": phase.value}, float(phase == status.phase))
        for phase in RolloutPhase
    ]
    samples.append(GaugeSample(CANARY_WEIGHT, {}, float(status.canary_weight)))
    samples.append(GaugeSample(EFFECTIVE_CANARY_WEIGHT, {}, float(status.effective_canary_weight)))
    samples.extend(
        GaugeSample(
            CONDITION,
            {"condition": condition.type, "status": value},
            float(condition.status == value),
        )
        for condition in status.conditions
        for value in _CONDITION_STATUSES
    )
    versions = {
        "stable_version": status.stable_version or "",
        "canary_version": status.canary_version or "",
    }
    samples.append(GaugeSample(INFO, versions, 1.0))
    return samples


class _ServiceGauges:
    """The last reported status of each InferenceService, exported at scrape time.

    A service's series are replaced as a whole, so a condition that is no longer reported
    (or a version that was replaced) leaves no stale series behind.
    """

    def __init__(self) -> None:
        self._samples: dict[tuple[str, str], list[GaugeSample]] = {}
        self._guard = threading.Lock()

    def observe(self, namespace: str, name: str, status: InferenceServiceStatus) -> None:
        samples = status_samples(status)
        with self._guard:
            self._samples[namespace, name] = samples

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._samples.pop((namespace, name), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._guard:
            services = list(self._samples.items())
        families = {family.name: family for family in self._families()}
        for (namespace, name), samples in services:
            for sample in samples:
                values = [namespace, name, *(sample.labels[k] for k in sample.gauge.labels)]
                families[sample.gauge.name].add_metric(values, sample.value)
        yield from families.values()

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(g.name, g.documentation, labels=["namespace", "name", *g.labels])
            for g in _SERVICE_GAUGES
        ]


class OperatorMetrics:
    """Reconcile counts, durations, errors, API writes, rollout outcomes and service state."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.reconciles = Counter(
            "fleetserve_operator_reconciles", "Reconciles of InferenceServices.",
            ["trigger", "result"], registry=self.registry,
        )  # fmt: skip
        self.errors = Counter(
            "fleetserve_operator_errors", "Reconciles that ended in an error, by error type.",
            ["error"], registry=self.registry,
        )  # fmt: skip
        self.duration_seconds = Histogram(
            "fleetserve_operator_reconcile_duration_seconds", "Time one reconcile took.",
            ["trigger"], registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )  # fmt: skip
        self.writes = Counter(
            "fleetserve_operator_writes", "Writes to the API server (apply, delete, status).",
            ["kind", "action"], registry=self.registry,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "fleetserve_operator_work_queue_depth",
            "InferenceServices queued for a reconcile, in any lane, not yet taken by a worker.",
            registry=self.registry,
        )
        self.reconciles_in_flight = Gauge(
            "fleetserve_operator_reconciles_in_flight",
            "Reconciles the work queue's workers are running now.",
            registry=self.registry,
        )
        self._rollout = {
            OperatorCounter.ROLLBACKS: Counter(
                OperatorCounter.ROLLBACKS.value.removesuffix("_total"),
                "Canaries withdrawn, by reason (AnalysisFailed, CanaryRestarted, Aborted, ...).",
                ["reason"], registry=self.registry,
            ),
            OperatorCounter.PROMOTIONS: Counter(
                OperatorCounter.PROMOTIONS.value.removesuffix("_total"),
                "New versions that became stable, by reason.",
                ["reason"], registry=self.registry,
            ),
        }  # fmt: skip
        self.webhook_failures = Counter(
            "fleetserve_operator_webhook_failures",
            "Rollout webhook POSTs given up after their retries, by type (notify, confirm) and "
            "reason (timeout, status, unreachable, secret, error).",
            ["type", "reason"], registry=self.registry,
        )  # fmt: skip
        self._services = _ServiceGauges()
        self.registry.register(self._services)

    def rollout_counter(self, counter: OperatorCounter) -> Counter:
        """The counter a rollout's `IncrementCounter` action names."""
        return self._rollout[counter]

    def observe_status(self, namespace: str, name: str, status: InferenceServiceStatus) -> None:
        """Export `status` as the InferenceService's gauges, replacing what it reported before."""
        self._services.observe(namespace, name, status)

    def forget_service(self, namespace: str, name: str) -> None:
        """Drop every gauge series of a deleted InferenceService (a no-op for an unknown one)."""
        self._services.forget(namespace, name)
