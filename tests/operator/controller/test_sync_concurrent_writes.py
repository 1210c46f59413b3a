"""A reconcile makes its independent requests at once on `Sync`'s write threads.

A change's canary Deployment and Service (and a new service's Services) are written in
one round trip of the API server instead of one after the other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from fleetserve_operator import naming
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import ChildRefused
from fleetserve_operator.records import Manifest
from fleetserve_operator.testing import FakeKube, make_service

_SERVICES = 2
"""A new service's Services: the umbrella one and the stable track's."""


@dataclass
class _Meeting(FakeKube):
    """A FakeKube whose Services' creates each wait until both are in flight at once."""

    meeting: threading.Barrier = field(
        default_factory=lambda: threading.Barrier(_SERVICES, timeout=5.0)
    )

    def create(self, manifest: Manifest) -> Manifest:
        if manifest["kind"] == "Service":
            self.meeting.wait()
        return super().create(manifest)


@pytest.mark.timeout(30)
def test_a_new_services_services_are_created_at_once_its_deployment_after() -> None:
    kube = _Meeting()
    kube.add_service(make_service())
    sync = Sync(kube, metrics=OperatorMetrics(), write_threads=_SERVICES)
    assert sync.run_by_name("ns", "demo", trigger="create") is None
    created = [(kind, name) for action, kind, name in kube.writes if action == "create"]
    assert sorted(created[:2]) == [("Service", "demo"), ("Service", "demo-stable")]
    assert created[2:] == [("Deployment", "demo-stable")]


@pytest.mark.timeout(30)
def test_a_refused_create_undoes_the_others_though_they_ran_at_once() -> None:
    kube = FakeKube()
    kube.add_service(make_service())
    kube.refusals[("Service", "demo")] = "port refused"
    sync = Sync(kube, metrics=OperatorMetrics(), write_threads=_SERVICES)
    assert isinstance(sync.run_by_name("ns", "demo", trigger="create"), ChildRefused)
    assert [write for write in kube.writes if write[1] != naming.KIND] == [
        ("create", "Service", "demo-stable"),
        ("delete", "Service", "demo-stable"),
    ]
    assert not [key for key in kube.objects if key[0] != naming.KIND]
