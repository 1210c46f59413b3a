"""The operator's own Prometheus metrics (`fleetserve_operator_*`), served by `__main__`.

`sync` counts every reconcile by trigger and outcome, times it, and counts the writes it
makes, so a restarted operator that writes nothing can be seen to write nothing. It also
counts the rollouts' rollbacks and promotions when a transition asks it to.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from fleetserve_operator.rollout import OperatorCounter

__all__ = ["OperatorMetrics"]


class OperatorMetrics:
    """Reconcile counts, durations, errors, API writes and rollout outcomes, in one registry."""

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

    def rollout_counter(self, counter: OperatorCounter) -> Counter:
        """The counter a rollout's `IncrementCounter` action names."""
        return self._rollout[counter]
