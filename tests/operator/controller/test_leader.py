"""Leader election: who may take the Lease and when, and the elector over an in-memory Lease.

`MemoryLeases` keeps one Lease the way the API server does: every write bumps its
`resourceVersion`, and a write naming an older one is refused with a conflict. Time is a
`FakeClock` except where a renewal thread runs.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from fleetserve_operator import __main__ as entry
from fleetserve_operator.controller.leader import (
    LEADER_GAUGE,
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
    LeaseSpec,
    LeaseTiming,
    LeaseUnavailable,
    StandbyProbe,
    candidate_identity,
    claimed,
    lost,
    may_take,
    observe,
)
from fleetserve_operator.controller.settings import OperatorConfig
from fleetserve_runtime.testing.process import free_port

TIMING = LeaseTiming(lease_duration_s=10, renew_deadline_s=8.0, retry_period_s=2.0)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


class MemoryLeases:
    """One Lease with the API server's optimistic concurrency; `failing` makes it unreachable."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.failing = False
        self.writes: list[str] = []
        self.before_write: Callable[[], None] | None = None
        self._version = 0

    def _store(self, spec: LeaseSpec) -> LeaseRecord:
        self._version += 1
        self.record = LeaseRecord(
            holder=spec["holderIdentity"] or "",
            duration_s=spec["leaseDurationSeconds"],
            transitions=spec["leaseTransitions"],
            acquire_time=spec["acquireTime"],
            resource_version=str(self._version),
        )
        self.writes.append(self.record.holder)
        return self.record

    def _check(self) -> None:
        if self.failing:
            raise LeaseUnavailable("the API server is unreachable")
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()

    def get(self, timeout_s: float) -> LeaseRecord | None:
        """The Lease, or None before the first write."""
        if self.failing:
            raise LeaseUnavailable("the API server is unreachable")
        return self.record

    def create(self, spec: LeaseSpec, timeout_s: float) -> LeaseRecord:
        """Create-only, as a POST."""
        self._check()
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(spec)

    def replace(self, spec: LeaseSpec, resource_version: str, timeout_s: float) -> LeaseRecord:
        """Write only over `resource_version`, as a PUT naming it."""
        self._check()
        if self.record is None or self.record.resource_version != resource_version:
            raise LeaseConflict("changed")
        return self._store(spec)

    def steal(self, holder: str) -> None:
        """Another candidate writes itself in (as after this one's lease expired)."""
        assert self.record is not None
        self._store(claimed(self.record, holder, TIMING, NOW))


class Ticks:
    """A monotonic clock that moves only when advanced."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        """Move on by `seconds` (the elector's `sleep`)."""
        self.now += seconds


def _elector(
    store: MemoryLeases,
    identity: str,
    clock: Ticks,
    *,
    timing: LeaseTiming = TIMING,
    registry: CollectorRegistry | None = None,
) -> LeaderElector:
    return LeaderElector(
        store,
        identity=identity,
        timing=timing,
        registry=registry or CollectorRegistry(),
        clock=lambda: clock.now,
        wall=lambda: NOW,
        sleep=clock.advance,
    )


def _record(holder: str, version: str = "1") -> LeaseRecord:
    return LeaseRecord(holder, 10, 0, None, version)


# --- the pure decisions ---------------------------------------------------------------------


def test_an_unchanged_lease_keeps_the_time_it_was_first_seen() -> None:
    """Expiry counts from the last change this candidate saw, not from each read."""
    first = observe(None, _record("a", "1"), now=5.0)
    assert observe(first, _record("a", "1"), now=9.0).seen_at == 5.0
    assert observe(first, _record("a", "2"), now=9.0).seen_at == 9.0


def test_a_held_lease_may_be_taken_only_after_a_whole_duration_unchanged() -> None:
    record = _record("a")
    seen = observe(None, record, now=100.0)
    assert not may_take(record, seen, "b", now=109.9)
    assert may_take(record, seen, "b", now=110.0)


def test_a_free_missing_or_own_lease_may_be_taken_at_once() -> None:
    seen = observe(None, None, now=0.0)
    assert may_take(None, seen, "b", now=0.0)
    assert may_take(_record(""), seen, "b", now=0.0)
    assert may_take(_record("b"), seen, "b", now=0.0)


def test_taking_over_counts_a_transition_and_renewing_keeps_the_acquire_time() -> None:
    created = claimed(None, "a", TIMING, NOW)
    assert created["leaseTransitions"] == 0
    record = LeaseRecord("a", 10, 0, created["acquireTime"], "1")
    renewed = claimed(record, "a", TIMING, datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC))
    assert renewed["acquireTime"] == created["acquireTime"]
    assert renewed["renewTime"] != created["renewTime"]
    assert renewed["leaseTransitions"] == 0
    assert claimed(record, "b", TIMING, NOW)["leaseTransitions"] == 1


def test_lease_times_always_carry_six_fraction_digits() -> None:
    """MicroTime needs the fraction, even at a whole second."""
    stamp = claimed(None, "a", TIMING, NOW)["renewTime"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", stamp), stamp


def test_a_leader_is_lost_past_the_renew_deadline_or_when_another_holds_the_lease() -> None:
    mine = _record("a")
    assert lost(mine, "a", renewed_at=0.0, now=7.9, timing=TIMING) is None
    assert "not renewed" in str(lost(mine, "a", renewed_at=0.0, now=8.0, timing=TIMING))
    assert "held by b" in str(lost(_record("b"), "a", renewed_at=0.0, now=1.0, timing=TIMING))


def test_identities_of_one_pod_differ() -> None:
    """A restarted container is a new candidate, though its pod name is the same."""
    first, second = candidate_identity("op-0"), candidate_identity("op-0")
    assert first.startswith("op-0_")
    assert second.startswith("op-0_")
    assert first != second


# --- the elector over an in-memory Lease ----------------------------------------------------


def test_of_two_candidates_one_leads_while_it_renews() -> None:
    store, clock = MemoryLeases(), Ticks()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert a.try_acquire()
    assert not b.try_acquire()
    for _ in range(20):  # 40 s: four lease durations, renewed every retry period
        clock.advance(TIMING.retry_period_s)
        assert a.try_acquire()
        assert not b.try_acquire()
    assert set(store.writes) == {"a"}


def test_a_standby_takes_over_one_lease_duration_after_the_last_renewal() -> None:
    store, clock = MemoryLeases(), Ticks()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert a.try_acquire()
    assert not b.try_acquire()
    clock.advance(TIMING.lease_duration_s - 0.1)
    assert not b.try_acquire()
    clock.advance(0.1)
    assert b.try_acquire()
    assert store.record is not None
    assert store.record.holder == "b"
    assert store.record.transitions == 1


def test_a_newcomer_waits_a_whole_duration_whatever_the_lease_says() -> None:
    """A lease renewed long ago by the wall clock still counts from when this one saw it."""
    store, clock = MemoryLeases(), Ticks()
    assert _elector(store, "a", clock).try_acquire()
    clock.advance(3600.0)
    late = _elector(store, "late", clock)
    assert not late.try_acquire()
    clock.advance(TIMING.lease_duration_s)
    assert late.try_acquire()


def test_of_two_candidates_writing_at_once_only_one_wins() -> None:
    """Both read the expired lease; the write that names the older version is refused."""
    store, clock = MemoryLeases(), Ticks()
    assert _elector(store, "old", clock).try_acquire()
    b, c = _elector(store, "b", clock), _elector(store, "c", clock)
    assert not b.try_acquire()
    assert not c.try_acquire()
    clock.advance(TIMING.lease_duration_s)
    results: list[bool] = []
    store.before_write = lambda: results.append(
        c.try_acquire()
    )  # c writes between b's read and write
    results.append(b.try_acquire())
    assert results == [True, False]
    assert store.record is not None
    assert store.record.holder == "c"


def test_blocking_acquire_returns_once_the_lease_is_free() -> None:
    store, clock = MemoryLeases(), Ticks()
    assert _elector(store, "a", clock).try_acquire()
    b = _elector(store, "b", clock)
    b.acquire()  # sleeps on the fake clock until the lease expires
    assert clock.now >= TIMING.lease_duration_s
    assert store.record is not None
    assert store.record.holder == "b"


def test_release_lets_a_standby_take_over_at_once() -> None:
    store, clock = MemoryLeases(), Ticks()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert a.try_acquire()
    assert not b.try_acquire()
    a.release()
    assert store.record is not None
    assert store.record.holder == ""
    assert b.try_acquire()  # no clock advance


def test_release_leaves_a_lease_held_by_another_alone() -> None:
    store, clock = MemoryLeases(), Ticks()
    a = _elector(store, "a", clock)
    assert a.try_acquire()
    store.steal("b")
    assert not a.try_acquire()
    a.release()
    assert store.record is not None
    assert store.record.holder == "b"


def test_the_gauge_reads_one_only_while_leading() -> None:
    store, clock, registry = MemoryLeases(), Ticks(), CollectorRegistry()
    a = _elector(store, "a", clock, registry=registry)
    assert registry.get_sample_value(LEADER_GAUGE) == 0.0
    assert a.try_acquire()
    assert registry.get_sample_value(LEADER_GAUGE) == 1.0
    a.release()
    assert registry.get_sample_value(LEADER_GAUGE) == 0.0


def _renewing(
    store: MemoryLeases, registry: CollectorRegistry, fault: Callable[[], None]
) -> list[str]:
    """Lead, renew in a thread (real time, 50 ms retries), inject `fault` at the next write.

    Returns the reasons `on_lost` was called with (empty if it was not, within 30 s).
    """
    timing = LeaseTiming(lease_duration_s=2, renew_deadline_s=0.5, retry_period_s=0.05)
    elector = LeaderElector(store, identity="a", timing=timing, registry=registry)
    assert elector.try_acquire()
    reasons: list[str] = []
    done = threading.Event()

    def on_lost(reason: str) -> None:
        reasons.append(reason)
        done.set()

    store.before_write = fault
    elector.start_renewing(on_lost)
    done.wait(timeout=30.0)
    return reasons


def test_a_leader_that_cannot_renew_gives_up() -> None:
    store, registry = MemoryLeases(), CollectorRegistry()
    reasons = _renewing(store, registry, lambda: setattr(store, "failing", True))
    assert reasons
    assert "not renewed" in reasons[0]
    assert registry.get_sample_value(LEADER_GAUGE) == 0.0


def test_a_leader_whose_lease_was_taken_gives_up() -> None:
    store, registry = MemoryLeases(), CollectorRegistry()
    reasons = _renewing(store, registry, lambda: store.steal("b"))
    assert reasons
    assert "held by b" in reasons[0]
    assert registry.get_sample_value(LEADER_GAUGE) == 0.0


def test_a_renewing_leader_keeps_the_lease_until_released() -> None:
    store = MemoryLeases()
    timing = LeaseTiming(lease_duration_s=2, renew_deadline_s=0.5, retry_period_s=0.05)
    elector = LeaderElector(store, identity="a", timing=timing, registry=CollectorRegistry())
    assert elector.try_acquire()
    reasons: list[str] = []
    elector.start_renewing(reasons.append)
    renewed = threading.Event()
    store.before_write = renewed.set
    assert renewed.wait(timeout=30.0), "no renewal"
    elector.release()
    assert reasons == []
    assert store.writes[0] == "a"
    assert store.writes[-1] == ""


# --- the standby's probe and the settings ---------------------------------------------------


def test_a_standby_answers_healthz_and_frees_the_port_for_kopf() -> None:
    port = free_port()
    with StandbyProbe("127.0.0.1", port):
        answer = httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False)
        assert answer.status_code == 200
        assert answer.json() == {"leader": False}
        assert httpx.get(f"http://127.0.0.1:{port}/other", trust_env=False).status_code == 404
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))  # kopf's liveness endpoint binds it next


def test_leader_election_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default; the Lease sits in the pod's namespace unless one is named."""
    monkeypatch.setenv("POD_NAMESPACE", "fleetserve-system")
    monkeypatch.setenv("POD_NAME", "fleetserve-operator-7d9f-x2l")
    config = OperatorConfig()
    assert config.leader_election
    assert config.leader_election_namespace == "fleetserve-system"
    assert config.pod_name == "fleetserve-operator-7d9f-x2l"
    assert config.lease_timing == TIMING
    monkeypatch.setenv("FLEETSERVE_LEADER_ELECTION_NAMESPACE", "ops")
    monkeypatch.setenv("FLEETSERVE_LEADER_ELECTION", "false")
    config = OperatorConfig()
    assert config.leader_election_namespace == "ops"
    assert not config.leader_election


def test_lease_timing_must_let_the_leader_give_up_before_a_standby_takes_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEETSERVE_RENEW_DEADLINE_S", "10")
    with pytest.raises(ValidationError, match="FLEETSERVE_RENEW_DEADLINE_S"):
        OperatorConfig()


def test_the_command_line_turns_leader_election_off(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[OperatorConfig] = []
    monkeypatch.setattr(entry, "_run", ran.append)
    assert entry.main(["run", "--leader-election=false"]) == 0
    assert not ran[0].leader_election
    assert entry.main(["run"]) == 0
    assert ran[1].leader_election


def test_a_leader_that_lost_the_lease_exits_with_status_1_at_once() -> None:
    """No clean-up runs that could still write: the process ends in the callback."""
    code = "from fleetserve_operator.__main__ import _exit_on_lost; _exit_on_lost('test')"
    proc = subprocess.run(  # the interpreter running these tests
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1
    assert "Lost the leader lease (test)" in proc.stderr
