"""Fixtures of the rollout e2e tests: the operator fixtures, Prometheus, a fast timer.

The operator fixtures (CRD, least-privilege identity, `start_operator`) are the operator
e2e's, imported from `operator_e2e/opfixtures.py`; the load driver and the operator process
live in the harness (`fleetserve_e2e.loadgen`, `fleetserve_e2e.operator_process`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# --import-mode=importlib puts no test folder on sys.path: add the operator e2e's (opkit,
# opfixtures).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator_e2e"))

from opfixtures import crd, operator_identity, operator_kubeconfig, start_operator

from fleetserve_e2e import LocalPrometheus
from fleetserve_e2e.operator_process import OperatorProcess

__all__ = [
    "crd",
    "operator_identity",
    "operator_kubeconfig",
    "rollout_operator",
    "start_operator",
]

ROLLOUT_SETTINGS = {
    # Steps fall due by the clock: tick well inside the tests' 4 s intervals.
    "FLEETSERVE_ROLLOUT_TICK_S": "0.5",
}


@pytest.fixture
def rollout_operator(
    start_operator: Callable[..., OperatorProcess], local_prometheus: LocalPrometheus
) -> Callable[[], OperatorProcess]:
    """Start (another) operator with the rollout timer at 0.5 s, allowed to query Prometheus."""
    allowed = {"FLEETSERVE_ALLOWED_PROMETHEUS_URLS": json.dumps([local_prometheus.url])}
    return lambda: start_operator({**ROLLOUT_SETTINGS, **allowed})
