"""Fixtures of the rollout e2e tests: an operator with a fast rollout timer, and the env.

`env` bundles what a rollout test works with (`fleetserve_e2e.rollout_testing.RolloutEnv`).

The operator fixtures it builds on (CRD, least-privilege identity, `start_operator`) are the
plugin `fleetserve_e2e.operator_fixtures`, registered by `e2e/conftest.py`; the load driver
and the operator process live in the harness (`fleetserve_e2e.loadgen`,
`fleetserve_e2e.operator_process`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from fleetserve_e2e import KubeClient, LocalCluster, LocalPrometheus
from fleetserve_e2e.operator_process import OperatorProcess
from fleetserve_e2e.rollout_testing import ROLLOUT_SETTINGS, RolloutEnv


@pytest.fixture
def rollout_operator(
    start_operator: Callable[..., OperatorProcess], local_prometheus: LocalPrometheus
) -> Callable[[], OperatorProcess]:
    """Start (another) operator with the rollout timer at 0.5 s, allowed to query Prometheus."""
    allowed = {"FLEETSERVE_ALLOWED_PROMETHEUS_URLS": json.dumps([local_prometheus.url])}
    return lambda: start_operator({**ROLLOUT_SETTINGS, **allowed})


@pytest.fixture
def env(
    kube: KubeClient,
    namespace: str,
    local_prometheus: LocalPrometheus,
    local_cluster: LocalCluster,
    rollout_operator: Callable[[], OperatorProcess],
) -> RolloutEnv:
    """The test's namespace in the session cluster, its Prometheus and rollout operators."""
    return RolloutEnv(kube, namespace, local_prometheus, local_cluster, rollout_operator)
