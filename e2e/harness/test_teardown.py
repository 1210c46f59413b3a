"""Teardown leaves nothing behind, and a second cluster runs beside the session's one."""

from __future__ import annotations

import time

from fleetserve_e2e import LocalCluster
from fleetserve_e2e.kubeapi import namespaced
from fleetserve_e2e.processes import find_marked, is_pid_alive
from fleetserve_e2e.testing import runtime_deployment, wait_for_ready_pods
from fleetserve_e2e.waiting import wait_until

# The target is 20 s once built; the assertion leaves headroom for a loaded 2-core box.
START_BUDGET_S = 45.0


def test_teardown_leaves_no_process_behind(
    local_cluster: LocalCluster, runtime_commands: dict[str, list[str]]
) -> None:
    """Every control-plane and pod process is gone after exit, and so is the temp dir."""
    started = time.monotonic()
    with LocalCluster(commands=runtime_commands, install_gateway_api=False) as cluster:
        start_s = time.monotonic() - started
        assert cluster.ports.apiserver != local_cluster.ports.apiserver
        cluster.client.create("/api/v1/namespaces", {"metadata": {"name": "teardown"}})
        deployment = runtime_deployment("leftover", replicas=1)
        cluster.client.create(
            namespaced("deployments", "teardown", group_version="apps/v1"), deployment
        )
        wait_for_ready_pods(cluster.client, "teardown", count=1)
        wait_until(cluster.pod_addresses, timeout_s=10, what="the pod process")
        pids = cluster.pids()
        marker, work_dir = cluster.marker, cluster.work_dir
    assert len(pids) == 5, pids  # etcd, apiserver, controller-manager, scheduler, one pod
    assert [pid for pid in pids if is_pid_alive(pid)] == []
    assert find_marked(marker) == []
    assert not work_dir.exists()
    assert start_s < START_BUDGET_S
    # The session's cluster was not disturbed.
    assert local_cluster.client.get_text("/readyz") == "ok"
