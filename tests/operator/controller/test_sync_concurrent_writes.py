"""A reconcile makes its independent requests at once on `Sync`'s write threads.

A change's canary Deployment and Service (and a new service's children) are written in
one round trip of the API server instead of one after the other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.errors import ChildRefused
from fleetserve_operator.records import Manifest
from fleetserve_operator.testing import FakeKube, make_service

_CHILDREN = 3
"""A new service's children: its stable Deployment, its Service and the stable track's."""


@dataclass
class _Meeting(FakeKube):
    """A FakeKube whose creates each wait until `meeting`'s parties are in flight at once."""

    meeting: threading.Barrier = field(
        default_factory=lambda: threading.Barrier(_CHILDREN, timeout=5.0)
    )

    def create(self, manifest: Manifest) -> Manifest:
        self.meeting.wait()
        return super().create(manifest)


@pytest.mark.timeout(30)
def test_a_new_services_children_are_created_at_once() -> None:
    kube = _Meeting()
    kube.add_service(make_service())
    sync = Sync(kube, metrics=OperatorMetrics(), write_threads=_CHILDREN - 1)
    assert sync.run_by_name("ns", "demo", trigger="create") is None
    assert kube.created() == [
        ("Deployment", "demo-stable"),
        ("Service", "demo"),
        ("Service", "demo-stable"),
    ]


@pytest.mark.timeout(30)
def test_a_refused_dry_run_stops_every_write_though_the_others_ran() -> None:
    kube = FakeKube()
    kube.add_service(make_service())
    kube.refusals[("Service", "demo")] = "port refused"
    sync = Sync(kube, metrics=OperatorMetrics(), write_threads=_CHILDREN - 1)
    assert isinstance(sync.run_by_name("ns", "demo", trigger="create"), ChildRefused)
    assert [write for write in kube.writes if write[0] == "create"] == []
