"""The precision benchmark end to end with tiny counts, and its closing figures' arithmetic.

No timing is asserted: the smoke run only proves every piece runs (servers in int8 pass the
guard, the load completes) and the closing lines are there and well formed.
"""

from __future__ import annotations

import pytest

from bench.precision_bench import best_int8, int8_speedup, model_uri, server_configs
from bench.report import ConfigResult
from bench.testing import run_bench


def result(label: str, rps: float) -> ConfigResult:
    return ConfigResult(
        label=label,
        description=label,
        server_args=(),
        sent=10,
        succeeded=10,
        client_status_counts={200: 10},
        timed_out=False,
        elapsed_s=1.0,
        throughput_rps=rps,
        p50_ms=1.0,
        p90_ms=1.0,
        p99_ms=1.0,
        mean_batch_size=1.0,
        padding_efficiency=1.0,
        real_tokens=10,
        expected_real_tokens=10,
        real_tokens_per_s=10.0,
        mfu=0.1,
        server_cpu_util=1.0,
        server_cpu_ms_per_request=1.0,
        client_cpu_util=0.1,
    )


def test_speedup_is_the_best_int8_over_fp32_torch() -> None:
    """The faster of the two int8 paths is divided by fp32 torch, not by ONNX fp32."""
    results = [result("fp32", 40), result("int8", 90), result("ort", 60), result("ort-int8", 70)]
    best = best_int8(results)
    assert best is not None
    assert best.label == "int8"
    assert int8_speedup(results) == pytest.approx(90 / 40)
    assert int8_speedup([result("fp32", 40)]) == 0.0


def test_onnx_configs_serve_their_own_model() -> None:
    """ONNX rows override the bench's model; torch rows keep it; int8 rows carry the floor."""
    configs = server_configs("file:///tmp/x/model.onnx", floor=0.98)
    assert model_uri(configs["ort-int8"], "builtin://minilm-l6") == "file:///tmp/x/model.onnx"
    assert model_uri(configs["int8"], "builtin://minilm-l6") == "builtin://minilm-l6"
    assert "--precision-min-cosine=0.98" in configs["int8"].args


@pytest.mark.timeout(600)
def test_smoke_run_prints_the_closing_lines() -> None:
    """fp32 and int8 torch servers under a tiny load; the last two lines parse."""
    *_, speedup_line, cosine_line = run_bench(
        "bench.precision_bench",
        ["--requests", "6", "--warmup", "2", "--concurrency", "2", "--configs", "fp32,int8"]
        + ["--time-limit-s", "60"],
        timeout_s=580,
    )
    name, _, speedup = speedup_line.partition("=")
    assert name == "int8_speedup"
    assert float(speedup) > 0
    name, _, cosine = cosine_line.partition("=")
    assert name == "int8_min_cosine"
    assert 0.99 <= float(cosine) < 1.0
