"""What keeps the operator flat at 1000 services: one resync lane instead of a timer per object.

`Sync` runs for real against `FakeKube`; the fake only records which services were read
(every reconcile reads its InferenceService first) and can hold a reconcile mid-way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kopf

from fleetserve_operator.controller.handlers import Resyncer, register
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import ClusterUnavailable
from fleetserve_operator.records import Manifest
from fleetserve_operator.testing import FakeKube, make_service


@dataclass
class ReadingKube(FakeKube):
    """`FakeKube` that records reads of InferenceServices and can fail them."""

    reads: list[str] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)

    def get_inference_service(self, namespace: str, name: str) -> Manifest | None:
        """Record the read, or fail it."""
        self.reads.append(name)
        if name in self.failing:
            raise ClusterUnavailable(f"GET {name}: connection refused")
        return super().get_inference_service(namespace, name)


def _kube(*names: str) -> ReadingKube:
    kube = ReadingKube()
    for name in names:
        kube.add_service(make_service(name=name))
    return kube


def _sync(kube: ReadingKube) -> Sync:
    return Sync(kube, metrics=OperatorMetrics())


def test_resync_is_one_lane_not_a_timer_per_object() -> None:
    """No kopf timer resyncs each object; one lane starts and stops with the operator."""
    registry = kopf.OperatorRegistry()
    register(registry, _sync(_kube()), resync_interval_s=60, rollout_tick_s=5, retry_delay_s=30)
    timers = {handler.id for handler in registry._spawning.get_all_handlers()}
    activities = {handler.id for handler in registry._activities.get_all_handlers()}
    assert timers == {"rollout"}
    assert {"resync-start", "resync-stop"} <= activities


def test_a_round_visits_every_service_once_spread_over_the_interval() -> None:
    kube = _kube("a", "b", "c")
    waits: list[float] = []
    lane = Resyncer(_sync(kube), interval_s=3.0, wait=lambda s: waits.append(s) is not None)
    for name in ("c", "a", "b"):
        lane.track("ns", name)
    assert lane.run_round() is False
    assert kube.reads == ["a", "b", "c"]
    assert waits == [1.0, 1.0, 1.0]
    assert kube.writes, "a visit is a real reconcile"


def test_a_deleted_service_is_not_visited() -> None:
    kube = _kube("a", "b")
    lane = Resyncer(_sync(kube), interval_s=2.0, wait=lambda _s: False)
    lane.track("ns", "a")
    lane.track("ns", "b")
    lane.forget("ns", "b")
    lane.run_round()
    assert kube.reads == ["a"]


def test_a_failed_visit_does_not_stop_the_round() -> None:
    kube = _kube("a", "b")
    kube.failing.add("a")
    lane = Resyncer(_sync(kube), interval_s=2.0, wait=lambda _s: False)
    lane.track("ns", "a")
    lane.track("ns", "b")
    lane.run_round()
    assert kube.reads == ["a", "b"]


def test_the_lane_stops_between_visits() -> None:
    kube = _kube("a", "b")
    lane = Resyncer(_sync(kube), interval_s=2.0, wait=lambda _s: True)
    lane.track("ns", "a")
    assert lane.run_round() is True
    assert kube.reads == []


def test_a_lane_thread_starts_and_stops() -> None:
    """Through kopf's activity signatures; an empty lane just waits for its stop."""
    lane = Resyncer(_sync(_kube()), interval_s=3600.0)
    lane.start(logger=None)
    lane.stop(logger=None)
    assert lane._thread is not None
    assert not lane._thread.is_alive()
