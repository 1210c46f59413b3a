"""Fixtures of the rollout e2e tests (issue 5): the operator fixtures, Prometheus, a fast timer.

The operator fixtures (CRD, least-privilege identity, `start_operator`) are the operator
e2e's, imported from `operator_e2e/opfixtures.py`; the helpers are `opkit`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# --import-mode=importlib puts no test folder on sys.path: add this one (loadgen) and the
# operator e2e's (opkit, opfixtures).
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "operator_e2e")]

from opfixtures import crd, operator_kubeconfig, start_operator  # noqa: E402
from opkit import OperatorProcess  # noqa: E402

__all__ = ["crd", "operator_kubeconfig", "rollout_operator", "start_operator"]

ROLLOUT_SETTINGS = {
    # Steps fall due by the clock: tick well inside the tests' 4 s intervals.
    "FLEETSERVE_ROLLOUT_TICK_S": "0.5",
}


@pytest.fixture
def rollout_operator(
    start_operator: Callable[..., OperatorProcess],
) -> Callable[[], OperatorProcess]:
    """Start (another) operator with the rollout timer at 0.5 s."""
    return lambda: start_operator(ROLLOUT_SETTINGS)
