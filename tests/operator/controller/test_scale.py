"""What keeps the operator flat at 1000 services: one resync lane instead of a timer per object.

`Sync` runs for real against `FakeKube`; the fake only records which services were read
(every reconcile reads its InferenceService first) and can hold a reconcile mid-way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kopf

from fleetserve_operator import naming
from fleetserve_operator.controller.handlers import Resyncer, register
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.service_cache import ServiceCache
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


def _services(kube: ReadingKube) -> ServiceCache:
    """The watch's cache, holding every service of `kube`."""
    services = ServiceCache()
    for (kind, _, _), obj in kube.objects.items():
        if kind == naming.KIND:
            services.store(obj)
    return services


def test_kopf_handles_no_inference_service_and_runs_one_resync_lane() -> None:
    """No kopf timer or handler per object; one lane starts and stops with the operator."""
    registry = kopf.OperatorRegistry()
    sync = _sync(_kube())
    register(registry, sync, Resyncer(sync, ServiceCache(), interval_s=60))
    activities = {handler.id for handler in registry._activities.get_all_handlers()}
    assert not registry._spawning.get_all_handlers()
    assert not registry._changing.get_all_handlers()
    assert not registry._watching.get_all_handlers()
    assert {"resync-start", "resync-stop"} <= activities


def test_a_round_visits_every_service_once_spread_over_the_interval() -> None:
    kube = _kube("c", "a", "b")
    waits: list[float] = []
    lane = Resyncer(
        _sync(kube), _services(kube), interval_s=3.0, wait=lambda s: waits.append(s) is not None
    )
    assert lane.run_round() is False
    assert kube.reads == ["a", "b", "c"]
    assert waits == [1.0, 1.0, 1.0]
    assert kube.writes, "a visit is a real reconcile"


def test_a_service_deleted_during_a_round_is_not_visited() -> None:
    kube = _kube("a", "b")
    services = _services(kube)
    gone = services.get("ns", "b")
    assert gone is not None

    def delete_b(_s: float) -> bool:
        services.discard(gone)
        return False

    lane = Resyncer(_sync(kube), services, interval_s=2.0, wait=delete_b)
    lane.run_round()
    assert kube.reads == ["a"]


def test_a_failed_visit_does_not_stop_the_round() -> None:
    kube = _kube("a", "b")
    kube.failing.add("a")
    lane = Resyncer(_sync(kube), _services(kube), interval_s=2.0, wait=lambda _s: False)
    lane.run_round()
    assert kube.reads == ["a", "b"]


def test_the_lane_stops_between_visits() -> None:
    kube = _kube("a", "b")
    lane = Resyncer(_sync(kube), _services(kube), interval_s=2.0, wait=lambda _s: True)
    assert lane.run_round() is True
    assert kube.reads == []


def test_a_lane_thread_starts_and_stops() -> None:
    """Through kopf's activity signatures; an empty lane just waits for its stop."""
    lane = Resyncer(_sync(_kube()), ServiceCache(), interval_s=3600.0)
    lane.start(logger=None)
    lane.stop(logger=None)
    assert lane._thread is not None
    assert not lane._thread.is_alive()
