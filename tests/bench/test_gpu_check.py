"""`make gpu-check` without a GPU: says so, skips, exits 0; its comparisons are exact."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bench.gpu_check import _cosines, _divergence
from bench.testing import run_bench


@pytest.mark.timeout(120)
def test_without_cuda_it_skips_and_succeeds() -> None:
    """No visible CUDA device: one explanation, `gpu_check=skipped` last, exit status 0."""
    lines = run_bench(
        "bench.gpu_check", timeout_s=110, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    )
    assert lines[-1] == "gpu_check=skipped"
    assert not any(line.startswith("check ") for line in lines)


def test_divergence_is_the_first_differing_token() -> None:
    """Equal prefixes are not a divergence; the first mismatch is reported by index."""
    assert _divergence([1, 2, 3], [1, 2, 3]) is None
    assert _divergence([1, 2, 3], [1, 2]) is None
    assert _divergence([1, 2, 3], [1, 9, 3]) == 1


def test_cosines_are_row_wise() -> None:
    """Identical rows give 1, orthogonal rows 0, regardless of scale."""
    a = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    b = np.array([[3.0, 0.0], [5.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(_cosines(a, b), [1.0, 0.0])
