"""Fixtures of the operator e2e tests: the CRD, a least-privilege identity, an operator per test.

They live in `opfixtures.py`, which `rollout_e2e/` shares.
"""

from __future__ import annotations

import sys
from pathlib import Path

# --import-mode=importlib puts no test folder on sys.path; the shared helpers live here.
# Nothing here imports pydantic or fleetserve_operator: the operator runs as a subprocess.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from opfixtures import crd, operator, operator_identity, operator_kubeconfig, start_operator

__all__ = ["crd", "operator", "operator_identity", "operator_kubeconfig", "start_operator"]
