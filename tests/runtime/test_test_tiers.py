"""What the test tiers promise about themselves: the operator tier runs without torch.

The operator image has no torch, and its tests must not need it either; a conftest or
plugin that imports torch would make `pytest tests/operator` pay for it and hide the day
the operator itself starts to depend on it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NO_TORCH = textwrap.dedent(
    """
    import importlib.abc
    import sys
    import traceback

    import pytest

    attempts = []

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                frames = [f for f in traceback.format_stack() if "<frozen" not in f]
                attempts.append("".join(frames[-6:-1]))
                raise ImportError("the operator tier must not import torch")
            return None

    sys.meta_path.insert(0, NoTorch())
    code = pytest.main(sys.argv[1:])
    if attempts:
        print("torch was imported from:", attempts[0], sep="\\n")
        sys.exit(99)
    sys.exit(code)
    """
)
"""Runs pytest with `import torch` refused and recorded, even where the caller catches it."""


def test_the_operator_tier_never_imports_torch() -> None:
    """`pytest tests/operator` collects and runs with torch impossible to import."""
    result = subprocess.run(  # this interpreter, fixed arguments
        [sys.executable, "-c", NO_TORCH, "tests/operator", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode != 99, output
    # 1: some operator test failed, which that test reports itself; anything else means
    # the tier did not run at all (usage error, nothing collected, interrupted).
    assert result.returncode in (0, 1), output
