"""`generation.dtype: int8`: the int8 product, the SmolLM2 int8 model against fp32, the guard.

The SmolLM2 test loads the real checkpoint and runs the load-time path (calibration, int8
copy, guard) and checks the figures the guard accepted are within its bounds. The guard's
refusals are checked on logits made to stray, and through the load path of a tiny GGUF with
the bound raised past reach; off the CPU and without the kernel the setting is refused
before anything is computed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from fleetserve_runtime.models.accuracy import AccuracyError
from fleetserve_runtime.models.generative import GenerativeHandler, GenerativeOptions
from fleetserve_runtime.models.int8_matmul import (
    Int8Weight,
    int8_kernel_refusal,
    int8_matmul,
    quantize_weight,
)
from fleetserve_runtime.models.llama import int8
from fleetserve_runtime.models.llama.checkpoint import load_checkpoint
from fleetserve_runtime.models.llama.config import Checkpoint
from fleetserve_runtime.models.llama.model import LlamaModel
from fleetserve_runtime.models.registry import resolve_handler

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


def test_int8_product_is_the_float_product_within_quantisation_error() -> None:
    """Per-channel weights and per-row activations: within 2% of `x @ w`, smoothed or not."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=generator)
    x[:, 3] *= 30  # an outlier input channel, as RMSNorm outputs carry
    w = torch.randn(64, 48, generator=generator)
    exact = x @ w
    smooth = x.abs().amax(dim=0).sqrt() / w.abs().amax(dim=1).sqrt()
    for weight in (quantize_weight(w), quantize_weight(w, smooth)):
        error = (int8_matmul(x, weight) - exact).abs().max() / exact.abs().max()
        assert error < 0.02
    one_row = int8_matmul(x[2:3], quantize_weight(w))
    assert torch.equal(one_row, int8_matmul(x, quantize_weight(w))[2:3])


@pytest.mark.timeout(900)
def test_smollm2_int8_logits_stay_within_the_bound_of_fp32(
    smollm2_checkpoint: Checkpoint,
) -> None:
    """The SmolLM2 int8 model passes its guard, with projections and head really int8."""
    reference = LlamaModel(
        smollm2_checkpoint.config, smollm2_checkpoint.weights, device=CPU, dtype=torch.float32
    )
    model, report = int8.int8_model(reference, smollm2_checkpoint.codec, CPU)
    assert report.top1_agreement >= int8.MIN_TOP1_AGREEMENT
    assert report.max_logit_error <= int8.MAX_LOGIT_ERROR
    layer = model._layers[0]
    for weight in (layer.qkv, layer.o, layer.gate_up, layer.down, model._lm_head):
        assert isinstance(weight, Int8Weight)
        assert weight.values.dtype == torch.int8
    assert isinstance(reference._lm_head, torch.Tensor)


def test_guard_refuses_logits_past_either_bound_naming_the_setting() -> None:
    """A swapped top token or one logit off by more than the bound: `AccuracyError`."""
    reference = torch.zeros(10, 6)
    reference[:, 0] = 5.0
    assert int8.check_logits(reference, reference + 0.5).top1_agreement == 1.0
    swapped = reference.clone()
    swapped[:2, 1] = 9.0  # 8 of 10 positions agree: under the floor
    with pytest.raises(AccuracyError, match=r"generation\.dtype int8 failed the accuracy guard"):
        int8.check_logits(reference, swapped)
    strayed = reference.clone()
    strayed[3, 4] = -(int8.MAX_LOGIT_ERROR + 1)
    with pytest.raises(AccuracyError, match=r"generation\.dtype int8.*largest logit error"):
        int8.check_logits(reference, strayed)
    with pytest.raises(AccuracyError, match=r"generation\.dtype int8"):
        int8.check_logits(reference, reference * float("nan"))


def _tiny_handler(write_tiny_gguf: Callable[..., Any]) -> GenerativeHandler:
    handler = resolve_handler(
        f"file://{write_tiny_gguf().path}",
        name="m",
        version="1",
        max_sequence_length=8,
        generative=GenerativeOptions(dtype="int8"),
    )
    assert isinstance(handler, GenerativeHandler)
    return handler


def test_tiny_model_loads_in_int8_through_the_load_path(
    write_tiny_gguf: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`generation.dtype: int8` reaches the model: int8 projections over fp32 KV blocks.

    The tiny model's random weights are no language model (the SmolLM2 test checks the
    accuracy), so its guard bound is lifted here.
    """
    monkeypatch.setattr(int8, "MAX_LOGIT_ERROR", float("inf"))
    handler = _tiny_handler(write_tiny_gguf)
    handler.load(CPU)
    assert isinstance(handler.lm, LlamaModel)
    assert handler.lm.dtype == torch.float32
    assert isinstance(handler.lm._layers[0].qkv, Int8Weight)


def test_a_failing_guard_refuses_the_load_naming_the_setting(
    write_tiny_gguf: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the floor past reach (the error bound lifted) the load raises, keeping nothing."""
    monkeypatch.setattr(int8, "MAX_LOGIT_ERROR", float("inf"))
    monkeypatch.setattr(int8, "MIN_TOP1_AGREEMENT", 1.01)
    handler = _tiny_handler(write_tiny_gguf)
    with pytest.raises(AccuracyError, match=r"generation\.dtype int8 failed the accuracy guard"):
        handler.load(CPU)
    with pytest.raises(RuntimeError, match="not loaded"):
        _ = handler.lm


def test_int8_is_refused_off_the_cpu_and_without_the_kernel(
    write_tiny_gguf: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA, or a torch without the CPU int8 product: refused naming the setting."""
    assert int8_kernel_refusal(CPU) is None
    handler = _tiny_handler(write_tiny_gguf)
    checkpoint = load_checkpoint(write_tiny_gguf().path)
    reference = LlamaModel(checkpoint.config, checkpoint.weights, device=CPU, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"generation\.dtype int8 .*CPU only, not on cuda"):
        int8.int8_model(reference, checkpoint.codec, torch.device("cuda"))

    def missing(*_: object) -> torch.Tensor:
        raise RuntimeError("_int_mm not implemented for CPU")

    monkeypatch.setattr(torch, "_int_mm", missing)
    with pytest.raises(ValueError, match=r"generation\.dtype int8 .*no CPU int8 matrix product"):
        handler.load(CPU)


def test_only_an_fp32_model_gets_int8_weights(write_tiny_gguf: Callable[..., Any]) -> None:
    """int8 products take fp32 activations, and a model is quantised once."""
    checkpoint = load_checkpoint(write_tiny_gguf().path)
    config, weights = checkpoint.config, checkpoint.weights
    bf16 = LlamaModel(config, weights, device=CPU, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp32 activations"):
        bf16.with_int8_weights(lambda _: None)
    once = LlamaModel(config, weights, device=CPU, dtype=torch.float32).with_int8_weights(
        lambda _: None
    )
    with pytest.raises(ValueError, match="int8 already"):
        once.with_int8_weights(lambda _: None)
