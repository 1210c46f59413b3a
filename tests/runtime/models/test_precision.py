"""Serving precision: int8 and bf16 MiniLM through the real load path, and the accuracy guard.

The runtime is started in process (as in test_api) with model control on, so a version is
loaded exactly as the load API loads it: resolve, load (quantise and guard), calibrate, warm,
activate. A refused version must never reach the registry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from fleetserve_runtime.models import quantize
from fleetserve_runtime.models.accuracy import (
    GUARD_TEXTS,
    AccuracyError,
    PrecisionOptions,
    SpeedError,
    check,
    check_speed,
    embed_texts,
)
from fleetserve_runtime.models.bert import BertEncoder
from fleetserve_runtime.models.minilm import MiniLMHandler
from fleetserve_runtime.models.registry import resolve_handler
from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import infer_request, make_config

# The `serve_with_admin` fixture (conftest.py).
ServeWithAdmin = Callable[
    ..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, httpx.AsyncClient, Runtime]]
]

MINILM = "builtin://minilm-l6"
CPU = torch.device("cpu")


def load_v2() -> dict[str, Any]:
    return {"parameters": {"version": "v2", "uri": MINILM}}


@pytest.fixture(scope="module")
def fp32_guard() -> np.ndarray:
    handler = MiniLMHandler("m", "1")
    handler.load(CPU)
    return embed_texts(handler, GUARD_TEXTS, CPU)


@pytest.mark.parametrize("precision", ["int8", "bf16"])
async def test_reduced_precision_loads_and_serves_close_to_fp32(
    precision: str,
    fp32_guard: np.ndarray,
    caplog: pytest.LogCaptureFixture,
    serve_with_admin: ServeWithAdmin,
) -> None:
    """A version loaded in int8 or bf16 passes the guard, keeps the figure, embeds like fp32."""
    caplog.set_level(logging.INFO, logger="fleetserve.runtime")
    texts = list(GUARD_TEXTS[:6])
    # The speed guard is off: these tests are about accuracy, on whatever CPU runs them.
    async with serve_with_admin(allowed=MINILM, precision=precision, precision_min_speedup=0) as (
        client,
        ctl,
        runtime,
    ):
        loaded = await ctl.post("/v2/repository/models/test/load", json=load_v2())
        response = await client.post("/v2/models/test/infer", json=infer_request(texts))
        metadata = runtime.registry.active.metadata
        described = (await client.get("/v2/models/test")).json()["parameters"]
    assert loaded.status_code == 200, loaded.text
    assert metadata.precision == precision
    assert metadata.min_cosine is not None
    assert 0.99 <= metadata.min_cosine < 1.0
    assert (described["precision"], described["min_cosine"]) == (precision, metadata.min_cosine)
    assert metadata.speedup is not None
    assert described["speedup"] == metadata.speedup
    ready = [r for r in caplog.records if r.getMessage() == "model ready"]
    assert [(r.__dict__["precision"], r.__dict__["min_cosine"]) for r in ready][-1] == (
        precision,
        metadata.min_cosine,
    )
    output = response.json()["outputs"][0]
    served = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    reference = fp32_guard[: len(texts)]
    cosines = (served * reference).sum(axis=1)
    assert cosines.min() >= 0.99
    # A reduced precision is not fp32: the figure is a measurement, not a copy.
    assert cosines.min() < 0.99999


def zeroing_first_feed_forward(real: Callable[..., BertEncoder]) -> Callable[..., BertEncoder]:
    """A quantiser that quantises as usual, then zeroes the first block's output GEMM."""

    def broken(encoder: BertEncoder, ranges: dict[str, torch.Tensor]) -> BertEncoder:
        quantised = real(encoder, ranges)
        layer: torch.nn.Module = quantised.blocks[0].ffn_out
        assert isinstance(layer, quantize.Int8Linear)
        layer.weight_t.zero_()
        return quantised

    return broken


async def test_a_broken_quantisation_is_refused_and_never_ready(
    monkeypatch: pytest.MonkeyPatch, serve_with_admin: ServeWithAdmin
) -> None:
    """A quantiser that wrecks a layer fails the guard: 400 naming the figure, v1 stays."""
    monkeypatch.setattr(
        quantize, "quantize_encoder", zeroing_first_feed_forward(quantize.quantize_encoder)
    )
    async with serve_with_admin(allowed=MINILM, precision="int8", precision_min_speedup=0) as (
        client,
        ctl,
        runtime,
    ):
        refused = await ctl.post("/v2/repository/models/test/load", json=load_v2())
        still = await client.post("/v2/models/test/infer", json=infer_request(["x"]))
        versions = runtime.registry.versions()
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert "precision int8 failed the accuracy guard: min cosine 0." in error
    assert "on guard text " in error
    assert "under the floor 0.99" in error
    assert versions == ["v1"]
    assert still.json()["model_version"] == "v1"


def test_the_floor_is_configurable_and_bounded() -> None:
    """A floor of 1.0 refuses int8; floors outside [0.9, 1.0] are configuration errors."""
    handler = MiniLMHandler("m", "1", precision=PrecisionOptions("int8", 1.0, 0.0))
    with pytest.raises(AccuracyError, match=r"min cosine 0\.99\d+ to fp32"):
        handler.load(CPU)
    for floor in (0.5, 1.01):
        with pytest.raises(ValueError, match="precision_min_cosine"):
            make_config(precision_min_cosine=floor)


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_a_precision_slower_than_asked_is_refused_naming_both_times(precision: str) -> None:
    """Under precision_min_speedup the load fails with both timings; no CPU is 100x faster."""
    handler = MiniLMHandler("m", "1", precision=PrecisionOptions(precision, 0.99, 100.0))
    with pytest.raises(SpeedError, match=rf"precision {precision} failed the speed guard: the "
                       r"guard texts took \d+ ms against \d+ ms in fp32 \(\d+\.\d\dx, under "
                       r"precision_min_speedup 100\.0\)"):  # fmt: skip
        handler.load(CPU)
    for floor in (-0.5, 101.0):
        with pytest.raises(ValueError, match="precision_min_speedup"):
            make_config(precision_min_speedup=floor)


def test_check_speed_divides_fp32_time_by_the_reduced_one() -> None:
    """The speed-up is fp32 time / reduced time; a floor of 0 accepts even a slowdown."""
    assert check_speed("int8", fp32_s=0.3, reduced_s=0.1, floor=1.0) == pytest.approx(3.0)
    assert check_speed("bf16", fp32_s=0.1, reduced_s=4.0, floor=0.0) == pytest.approx(0.025)
    with pytest.raises(SpeedError, match=r"took 4000 ms against 100 ms in fp32 \(0\.03x"):
        check_speed("int8", fp32_s=0.1, reduced_s=4.0, floor=1.0)
    with pytest.raises(SpeedError, match="int8 needs VNNI or AMX"):
        check_speed("int8", fp32_s=0.1, reduced_s=0.11, floor=1.0)


def test_check_names_the_worst_text() -> None:
    """The worst row's index and cosine are reported; a NaN row counts as a failure."""
    reference = np.eye(3, dtype=np.float32)
    candidate = reference.copy()
    candidate[1] = [0.0, 0.6, 0.8]
    report = check("int8", reference, candidate, floor=0.5)
    assert (report.worst_index, round(report.min_cosine, 6)) == (1, 0.6)
    candidate[2] = np.nan
    with pytest.raises(AccuracyError, match="min cosine -1.0000 to fp32, on guard text 2"):
        check("int8", reference, candidate, floor=0.5)


def test_precision_is_refused_for_models_without_it() -> None:
    """int8 on a serialized module is a clear error, not a silent fp32."""
    with pytest.raises(ValueError, match="precision int8 applies to builtin://minilm-l6"):
        resolve_handler(
            "fleetserve_runtime.testing:exploding_handler",
            name="m",
            version="1",
            max_sequence_length=16,
            precision=PrecisionOptions("int8"),
        )


def test_int8_is_cpu_only() -> None:
    """int8 on a non-CPU device is refused before any work."""
    handler = MiniLMHandler("m", "1", precision=PrecisionOptions("int8"))
    with pytest.raises(ValueError, match="int8 runs on the CPU only, not on meta"):
        handler.load(torch.device("meta"))
