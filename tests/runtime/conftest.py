"""Runtime-tier pytest hooks: tests marked `gpu` skip cleanly without CUDA.

This lives here, not in tests/conftest.py, because it imports torch: the operator tier
(`pytest tests/operator`) must run without it, as the operator image has no torch.
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `gpu` when no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
