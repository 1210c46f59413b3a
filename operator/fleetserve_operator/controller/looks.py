"""What one reconcile reads from Prometheus: the rollout's facts at this look.

A due canary analysis (threshold mode) or the sequential tests' evidence (at every look while
a canary holds a step), the shadow stage's agreement, and stable's error ratio when it can
trigger a failover. `Sync` asks for them once per reconcile; the rollout machine decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetserve_operator import analysis, observe, render, rollout
from fleetserve_operator.analysis import MetricSource, agreement
from fleetserve_operator.controller.kube import ObjectRef
from fleetserve_operator.naming import Track
from fleetserve_operator.records import Manifest
from fleetserve_operator.spec import (
    AnalysisMode,
    AnalysisResult,
    Evidence,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutPhase,
    ShadowEvidence,
    Verdict,
)

__all__ = ["MetricLooks"]


@dataclass(frozen=True)
class MetricLooks:
    """Reads through `metric_source(url)`, from the spec's Prometheus or the default.

    A spec without its own `prometheusUrl` is read from `default_prometheus_url`; with
    neither, nothing is read, so nothing is judged.
    """

    metric_source: Callable[[str], MetricSource]
    default_prometheus_url: str | None = None

    def facts(
        self,
        ref: ObjectRef,
        spec: InferenceServiceSpec,
        previous: InferenceServiceStatus,
        deployments: Mapping[Track, Manifest],
        pods: list[Manifest],
        meta: Mapping[str, Any],
        now: datetime,
    ) -> rollout.Facts:
        """What the rollout needs to know now (a due analysis queries Prometheus)."""
        evidence, result = self._analysis(ref.namespace, spec, previous, now)
        shadow_evidence, shadow_result = self._shadow_look(ref.namespace, spec, previous, now)
        return rollout.Facts(
            stable=observe.track_facts(deployments.get(Track.STABLE), pods),
            canary=observe.track_facts(deployments.get(Track.CANARY), pods),
            stable_error_ratio=self._stable_error_ratio(ref.namespace, spec, previous),
            annotations=dict(meta.get("annotations") or {}),
            analysis=result or shadow_result,
            evidence=evidence,
            shadow_evidence=shadow_evidence,
        )

    def prometheus_url(self, spec: InferenceServiceSpec) -> str | None:
        """Where `spec`'s metrics are read: its analysis's URL, else the operator's default."""
        checks = spec.rollout.analysis
        return checks.prometheus_url if checks else self.default_prometheus_url

    def _stable_error_ratio(
        self, namespace: str, spec: InferenceServiceSpec, previous: InferenceServiceStatus
    ) -> float | None:
        """Stable's 5xx ratio over `fallback.errorWindow`, when it can trigger a failover."""
        fallback, url = spec.fallback, self.prometheus_url(spec)
        if not fallback.enabled or fallback.max_error_rate is None or url is None:
            return None
        model = render.stable_pods(spec, previous).model
        scope = analysis.TrackScope(namespace, model.name, model.version, Track.STABLE)
        return analysis.read_stable_error_ratio(
            self.metric_source(url), scope, fallback.error_window
        )

    def _analysis(
        self,
        namespace: str,
        spec: InferenceServiceSpec,
        previous: InferenceServiceStatus,
        now: datetime,
    ) -> tuple[Evidence | None, AnalysisResult | None]:
        """The sequential tests' new evidence, and the canary's analysis when there is one.

        Threshold mode queries only when an analysis is due; sequential mode at every look
        while the canary holds a step (Prometheus changes once per scrape, and status is
        written only when the evidence changed).
        """
        checks = spec.rollout.analysis
        if checks is None or not rollout.is_watching(previous):
            return None, None
        due = rollout.is_analysis_due(spec, previous, now)
        target = analysis.target_for(spec, previous, namespace=namespace)
        source = self.metric_source(checks.prometheus_url)
        if checks.mode is AnalysisMode.SEQUENTIAL:
            return analysis.watch(source, checks, target, previous.rollout.evidence, due=due)
        return None, analysis.evaluate(source, checks, target) if due else None

    def _shadow_look(
        self,
        namespace: str,
        spec: InferenceServiceSpec,
        previous: InferenceServiceStatus,
        now: datetime,
    ) -> tuple[ShadowEvidence | None, AnalysisResult | None]:
        """While shadowing: the stage's evidence at this look, and its verdict when due.

        Read at every look, as sequential mode is, over the stable pods' shadow series
        labelled with the canary's version; a Failed verdict acts at once. Without a
        Prometheus to read, nothing: the stage then ends at `maxDuration`, never passing.
        """
        shadow, stage = spec.rollout.shadow, previous.rollout.shadow
        url = self.prometheus_url(spec)
        if shadow is None or stage is None or url is None:
            return None, None
        if previous.current_phase is not RolloutPhase.SHADOWING:
            return None, None
        model = render.stable_pods(spec, previous).model
        scope = analysis.TrackScope(namespace, model.name, model.version, Track.STABLE)
        evidence, result = agreement.watch(
            self.metric_source(url),
            agreement.ShadowPolicy.of(shadow),
            scope,
            previous.canary_version or spec.model.version,
            stage.evidence,
        )
        due = rollout.is_shadow_due(spec, previous, now)
        return evidence, result if due or result.verdict is Verdict.FAILED else None
