"""The operator's per-InferenceService gauges: status → samples, export, and forgetting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve_operator import naming
from fleetserve_operator.controller import handlers
from fleetserve_operator.controller.metrics import (
    CANARY_WEIGHT,
    CONDITION,
    EFFECTIVE_CANARY_WEIGHT,
    INFO,
    PHASE,
    GaugeSample,
    OperatorMetrics,
    status_samples,
)
from fleetserve_operator.controller.service_cache import ServiceCache
from fleetserve_operator.controller.service_watch import ServiceSink
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.spec import Condition, InferenceServiceStatus, RolloutPhase
from fleetserve_operator.testing import FakeKube, make_service

STAMP = "2025-01-01T00:00:00Z"
METRICS_PAGE = (
    Path(__file__).resolve().parents[3] / "docs" / "reference" / "metrics.md"
).read_text()


def _condition(kind: str, status: str) -> Condition:
    return Condition.model_validate(
        {"type": kind, "status": status, "reason": "Test", "lastTransitionTime": STAMP}
    )


def _series(metrics: OperatorMetrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every fleetserve_operator_* gauge sample, as a scrape would see it."""
    text = generate_latest(metrics.registry).decode()
    return {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(text)
        if family.type == "gauge"
    }


def _value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"namespace": "ns", "name": "demo", **labels})


@pytest.mark.parametrize("phase", list(RolloutPhase), ids=str)
def test_phase_is_a_state_set_over_every_phase(phase: RolloutPhase) -> None:
    """One sample per RolloutPhase: 1 for the current phase, 0 for the others."""
    samples = status_samples(InferenceServiceStatus(phase=phase))
    phases = {s.labels["phase"]: s.value for s in samples if s.gauge is PHASE}
    assert phases == {p.value: float(p == phase) for p in RolloutPhase}


def test_no_phase_yet_sets_every_phase_to_zero() -> None:
    """A status without a phase (never reconciled) claims none."""
    samples = status_samples(InferenceServiceStatus())
    assert {s.value for s in samples if s.gauge is PHASE} == {0.0}


def test_weight_conditions_and_versions() -> None:
    """Both canary weights as they are; each condition a state set over True/False/Unknown."""
    status = InferenceServiceStatus(
        phase=RolloutPhase.PROGRESSING,
        stable_version="1",
        canary_version="2",
        canary_weight=20,
        effective_canary_weight=25,
        conditions=[_condition("Ready", "True"), _condition("Degraded", "Unknown")],
    )
    samples = [s for s in status_samples(status) if s.gauge is not PHASE]
    assert samples == [
        GaugeSample(CANARY_WEIGHT, {}, 20.0),
        GaugeSample(EFFECTIVE_CANARY_WEIGHT, {}, 25.0),
        GaugeSample(CONDITION, {"condition": "Ready", "status": "True"}, 1.0),
        GaugeSample(CONDITION, {"condition": "Ready", "status": "False"}, 0.0),
        GaugeSample(CONDITION, {"condition": "Ready", "status": "Unknown"}, 0.0),
        GaugeSample(CONDITION, {"condition": "Degraded", "status": "True"}, 0.0),
        GaugeSample(CONDITION, {"condition": "Degraded", "status": "False"}, 0.0),
        GaugeSample(CONDITION, {"condition": "Degraded", "status": "Unknown"}, 1.0),
        GaugeSample(INFO, {"stable_version": "1", "canary_version": "2"}, 1.0),
    ]


def test_without_a_canary_the_weight_is_zero_and_its_version_empty() -> None:
    """Outside a rollout the weight reads 0 and `canary_version` is ''."""
    samples = status_samples(InferenceServiceStatus(stable_version="1"))
    assert GaugeSample(CANARY_WEIGHT, {}, 0.0) in samples
    assert GaugeSample(INFO, {"stable_version": "1", "canary_version": ""}, 1.0) in samples


def test_a_new_status_replaces_every_series_of_the_service() -> None:
    """A condition no longer reported and a replaced version leave no stale series."""
    metrics = OperatorMetrics()
    first = InferenceServiceStatus(
        stable_version="1", canary_version="2", conditions=[_condition("FallbackActive", "True")]
    )
    metrics.observe_status("ns", "demo", first)
    metrics.observe_status("ns", "demo", InferenceServiceStatus(stable_version="2"))
    series = _series(metrics)
    assert series[CONDITION.name] == {}
    assert list(series[INFO.name]) == [
        (("canary_version", ""), ("name", "demo"), ("namespace", "ns"), ("stable_version", "2"))
    ]


def test_forgetting_a_service_drops_its_series_only() -> None:
    """Every series of the forgotten service goes; another service's stay."""
    metrics = OperatorMetrics()
    status = InferenceServiceStatus(
        phase=RolloutPhase.SUCCEEDED, conditions=[_condition("Ready", "True")]
    )
    metrics.observe_status("ns", "demo", status)
    metrics.observe_status("ns", "other", status)
    metrics.forget_service("ns", "demo")
    metrics.forget_service("ns", "never-seen")
    series = _series(metrics)
    for gauge in (PHASE, CANARY_WEIGHT, CONDITION, INFO):
        assert series[gauge.name], gauge.name
        assert {dict(labels)["name"] for labels in series[gauge.name]} == {"other"}


def _reconciled() -> tuple[FakeKube, OperatorMetrics, Sync]:
    kube = FakeKube()
    kube.add_service(make_service())
    metrics = OperatorMetrics()
    sync = Sync(kube, metrics=metrics)
    sync.run_by_name("ns", "demo", trigger="create")
    return kube, metrics, sync


def test_a_reconcile_exports_the_status_it_reports() -> None:
    """After a reconcile the gauges say what status says: Pending, weight 0, Ready False."""
    _, metrics, _ = _reconciled()
    assert _value(metrics, PHASE.name, phase="Pending") == 1.0
    assert _value(metrics, PHASE.name, phase="Succeeded") == 0.0
    assert _value(metrics, CANARY_WEIGHT.name) == 0.0
    assert _value(metrics, CONDITION.name, condition="Ready", status="False") == 1.0


def test_a_restarted_operator_exports_an_unchanged_status() -> None:
    """A reconcile that writes nothing (after a restart) still fills the new process's gauges."""
    kube, _, _ = _reconciled()
    writes = list(kube.writes)
    metrics = OperatorMetrics()
    Sync(kube, metrics=metrics).run_by_name("ns", "demo", trigger="resume")
    assert kube.writes == writes
    assert _value(metrics, PHASE.name, phase="Pending") == 1.0


def test_a_deleted_event_forgets_the_service_without_a_finalizer() -> None:
    """The service watch's DELETED event queues the service; its reconcile drops the gauges."""
    kube, metrics, sync = _reconciled()
    workers = handlers.QueueWorkers(sync, metrics, workers=1)
    sink = ServiceSink(ServiceCache(), workers, "ns")
    body = kube.get_inference_service("ns", "demo")
    assert body is not None
    assert not body["metadata"].get("finalizers")
    sink.changed(body)
    assert workers.run_one()
    assert _value(metrics, PHASE.name, phase="Pending") == 1.0
    del kube.objects[(naming.KIND, "ns", "demo")]
    sink.deleted(body)
    assert workers.run_one()
    assert _value(metrics, PHASE.name, phase="Pending") is None
    assert _value(metrics, CANARY_WEIGHT.name) is None


def test_a_reconcile_that_finds_the_service_gone_forgets_it() -> None:
    """A deletion the handler missed is forgotten by the next event's reconcile."""
    kube, metrics, sync = _reconciled()
    kube.objects[(naming.KIND, "ns", "demo")]["metadata"]["deletionTimestamp"] = STAMP
    sync.run_by_name("ns", "demo", trigger="child")
    assert _value(metrics, CANARY_WEIGHT.name) is None


def test_metrics_page_lists_exactly_the_exported_metrics() -> None:
    """The metrics page's "Operator metrics" table names every exported family, and no other."""
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in OperatorMetrics().registry.collect()
    }
    section = METRICS_PAGE.split("## Operator metrics", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"`(fleetserve_operator_[a-z_]+)`", section)) == exported
