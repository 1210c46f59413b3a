"""The tenants benchmark in a tiny configuration: it runs, and the quota protects the quiet."""

from __future__ import annotations

import pytest

from bench.tenants_bench import (
    CONFIGS,
    NOISY,
    QUIET,
    Engine,
    TenantWorkload,
    arrivals,
    main,
    p99,
    simulate,
)

TINY = TenantWorkload(duration_s=4.0, quiet_rate=5.0, noise_factor=10.0, seed=1)


def test_arrivals_are_ten_times_as_many_for_the_noisy_tenant() -> None:
    events = arrivals(TenantWorkload(duration_s=200.0, quiet_rate=2.0), noisy=True)
    noisy = sum(name == NOISY for _, name in events)
    quiet = sum(name == QUIET for _, name in events)
    assert 8 < noisy / quiet < 12
    assert [t for t, _ in events] == sorted(t for t, _ in events)


def test_the_quota_refuses_only_the_noisy_tenant_and_bounds_the_quiet_latency() -> None:
    by_name = {config.name: config for config in CONFIGS}
    alone = simulate(TINY, Engine(), by_name["quiet alone"])
    guarded = simulate(TINY, Engine(), by_name["fair + quota"])
    flooded = simulate(TINY, Engine(), by_name["no tenants"])
    assert {name for name, code in guarded.refused if code == 429} == {NOISY}
    assert len(guarded.latencies[QUIET]) == len(alone.latencies[QUIET])
    ratio = p99(guarded.latencies[QUIET]) / p99(alone.latencies[QUIET])
    assert ratio < p99(flooded.latencies[QUIET]) / p99(alone.latencies[QUIET])


def test_the_headline_is_the_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--duration-s", "2", "--quiet-rate", "4", "--seed", "3"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("quiet_p99_ratio=")
    float(last.partition("=")[2])
