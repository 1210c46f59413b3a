"""The scale run's counting: audit-log lines, percentiles, KWOK's stages, the machine's busy time.

No cluster: the audit lines are in the API server's JSON format (audit.k8s.io/v1 Event,
Metadata level); the KWOK stages are read from the pinned module's source.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import yaml

from fleetserve_e2e.kwok import DEFAULT_STAGES, kwok_version, write_stages
from fleetserve_e2e.operator_scale import count_requests, percentile, reconcile_counts
from fleetserve_e2e.proc_stats import busy_s

OPERATOR = "system:serviceaccount:fleetserve-system-bench:fleetserve-operator"
START = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def _line(
    verb: str, resource: str, *, at_s: float, user: str = OPERATOR, sub: str = "", query: str = ""
) -> str:
    stamp = f"2023-11-14T22:13:{20 + at_s:09.6f}Z"
    ref = {"resource": resource, "namespace": "bench", "name": "svc-0001"}
    if sub:
        ref["subresource"] = sub
    return json.dumps(
        {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "stage": "ResponseComplete",
            "requestURI": f"/apis/x/namespaces/bench/{resource}/svc-0001{query}",
            "verb": verb,
            "user": {"username": user},
            "objectRef": ref,
            "requestReceivedTimestamp": stamp,
        }
    )


def test_only_the_operators_writes_in_the_window_count() -> None:
    """Dry-runs, Lease renewals and reads are apart; others' requests do not count."""
    lines = [
        _line("patch", "inferenceservices", at_s=1, sub="status"),
        _line("patch", "deployments", at_s=2),
        _line("patch", "deployments", at_s=2.5, query="?dryRun=All&fieldManager=x"),
        _line("update", "leases", at_s=3),
        _line("list", "pods", at_s=3),
        _line("get", "inferenceservices", at_s=4),
        _line("patch", "deployments", at_s=4, user="system:serviceaccount:kube-system:other"),
        _line("create", "events", at_s=10.5),  # after the window
        _line("create", "events", at_s=0.5),  # before it
    ]
    counted = count_requests(lines, username=OPERATOR, start=START + 1, end=START + 10)
    assert counted.writes == 2
    assert counted.by_kind == {"patch inferenceservices/status": 1, "patch deployments": 1}
    assert counted.dry_runs == 1
    assert counted.lease_writes == 1
    assert counted.reads == 2


def test_percentiles_are_nearest_rank() -> None:
    """p99 of 100 values is the 99th; nothing measured is NaN, not 0."""
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([0.3], 0.99) == 0.3
    assert math.isnan(percentile([], 0.5))


def test_the_default_stages_are_kwoks_own(tmp_path: Path) -> None:
    """The config holds kwokctl's five default stages, read from the pinned release."""
    assert kwok_version() == "v0.8.0"
    source = tmp_path / "kwok"
    for stage in DEFAULT_STAGES:
        path = source / stage
        path.parent.mkdir(parents=True, exist_ok=True)
        name = Path(stage).stem
        path.write_text(
            f"apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: {name}\n"
        )
    written = write_stages(tmp_path / "stages.yaml", source)
    documents = list(yaml.safe_load_all(written.read_text(encoding="utf-8")))
    assert [d["metadata"]["name"] for d in documents] == [
        "node-initialize",
        "node-heartbeat",
        "pod-ready",
        "pod-complete",
        "pod-delete",
    ]


def test_busy_time_is_every_state_but_idle_iowait_and_steal() -> None:
    """Ticks of user, nice, system, irq and softirq; guest time is inside user already."""
    tick = os.sysconf("SC_CLK_TCK")
    #       cpu  user nice system idle    iowait irq softirq steal guest guest_nice
    stat = f"cpu  {tick * 10} {tick} {tick * 4} 900000 70000 {tick} {tick * 2} 5000 3000 0\n"
    stat += "cpu0 1 2 3 4 5 6 7 8 9 10\nintr 12345\n"
    assert busy_s(stat) == 18.0


def test_merged_child_events_are_counted_apart_from_the_reconciles_that_ran() -> None:
    """A merged event ran no reconcile; every other result did, an error's too."""
    counters = {
        (("result", "ok"), ("trigger", "child")): 1000.0,
        (("result", "coalesced"), ("trigger", "child")): 6000.0,
        (("result", "ok"), ("trigger", "create")): 990.0,
        (("result", "InvalidSpec"), ("trigger", "create")): 10.0,
    }
    assert reconcile_counts(counters) == ({"child": 1000.0, "create": 1000.0}, 6000.0)
