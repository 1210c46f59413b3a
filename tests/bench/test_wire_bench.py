"""Smoke test of `bench.wire_bench`: both formats answered, and the comparison printed last."""

from __future__ import annotations

import numpy as np
import pytest

from bench.testing import run_bench
from bench.wire_bench import binary_request, decode_answer, json_request


def test_both_formats_decode_to_the_same_shape() -> None:
    """The bench's two bodies carry the same texts; its decoder reads both answer formats."""
    texts = ["one", "two ✓"]
    assert json_request(texts).headers["Content-Type"] == "application/json"
    binary = binary_request(texts)
    size = int(binary.headers["Inference-Header-Content-Length"])
    assert binary.body[size:] == b"\x03\x00\x00\x00one\x07\x00\x00\x00two \xe2\x9c\x93"
    header = b'{"outputs":[{"shape":[2,2]}]}'
    values = np.arange(4, dtype="<f4")
    decoded = decode_answer(header + values.tobytes(), str(len(header)))
    np.testing.assert_array_equal(decoded, values.reshape(2, 2))
    np.testing.assert_array_equal(
        decode_answer(b'{"outputs":[{"shape":[2,2],"data":[0,1,2,3]}]}', None), decoded
    )


@pytest.mark.timeout(180)
def test_tiny_run_prints_the_comparison() -> None:
    """A real server, a few requests per format: every answer a 200, the ratio last."""
    model = "builtin://synthetic?latency_ms=0&per_item_ms=0&dim=384"
    lines = run_bench(
        "bench.wire_bench",
        [f"--model={model}", "--requests=8", "--warmup=2", "--batch=4", "--rounds=1"]
        + ["--concurrency=2"],
        timeout_s=170,
    )
    rows = {line.split()[0]: line for line in lines if line.startswith(("json ", "binary "))}
    assert set(rows) == {"json", "binary"}
    assert all(row.endswith("{200: 8}") for row in rows.values())
    assert lines[-1].startswith("binary_vs_json=")
    assert float(lines[-1].partition("=")[2]) > 0
