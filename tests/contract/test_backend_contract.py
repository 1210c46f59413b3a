"""Operator → runtime: `backend` renders as the runtime's flag, refused exactly where it refuses.

The operator refuses a track's pinned backend (`torch`, `onnxruntime`) from the spec alone;
the runtime decides at load (`choose_backend`, and the ONNX handler's own checks). Both run
here on the same cases, with the device the runtime would resolve on the track's pod.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pydantic import ValidationError

from fleetserve_operator import contract
from fleetserve_operator.naming import Track
from fleetserve_operator.render import plan_tracks
from fleetserve_operator.render.pods import runtime_args
from fleetserve_operator.spec import Backend, InferenceServiceStatus, Precision
from fleetserve_operator.testing import make_spec
from fleetserve_runtime.cli import parse_config
from fleetserve_runtime.models.accuracy import PrecisionOptions
from fleetserve_runtime.models.registry import choose_backend, resolve_handler

MODELS: dict[str, dict[str, str]] = {
    "minilm": {"uri": "builtin://minilm-l6"},
    "synthetic": {"uri": "builtin://synthetic?latency_ms=1"},
    "smollm2": {"uri": "builtin://smollm2-135m"},
    "onnx-file": {"uri": "file:///models/enc/model.onnx"},
    "onnx-pvc": {"uri": "pvc://models/enc/model.onnx"},
    "torch-file": {"uri": "file:///models/enc/model.pt"},
    "handler": {"handler": "my_models.encoders:build"},
}
GPU = {"limits": {"nvidia.com/gpu": 1}}
# How the GPU tracks' pods are placed, and the device the runtime resolves on them (`auto`
# takes CUDA exactly when the pod was given a GPU).
PLACEMENTS: list[tuple[dict[str, Any], str]] = [
    ({"device": "cpu"}, "cpu"),
    ({"device": "cpu", "resources": GPU}, "cpu"),
    ({"device": "auto"}, "cpu"),
    ({"device": "auto", "resources": GPU}, "cuda"),
    ({"device": "cuda", "resources": GPU}, "cuda"),
]
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16", "int8")


def _runtime_refuses(uri: str, backend: Backend, precision: Precision, device: str) -> bool:
    """True when the runtime would not start `uri` on `backend` in `precision` on `device`."""
    options = PrecisionOptions(precision=precision)
    try:
        chosen = choose_backend(uri, backend, device=device, precision=precision)
        if chosen == "onnxruntime":
            # Built, not loaded; a load on the CPU would need the graph, one on a GPU stops
            # before it reads anything.
            handler = resolve_handler(
                uri,
                name="m",
                version="1",
                max_sequence_length=32,
                precision=options,
                backend=backend,
                device=device,
            )
            if device != "cpu":
                handler.load(torch.device(device))
    except ValueError:
        return True
    return False


def _operator_refuses(model: dict[str, str], **sections: Any) -> bool:
    try:
        make_spec(model={"name": "m", "version": "1", **model}, **sections)
    except ValidationError:
        return True
    return False


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
@pytest.mark.parametrize("name", MODELS)
def test_operator_refuses_a_pinned_backend_exactly_where_the_runtime_does(
    name: str, backend: Backend
) -> None:
    """For each placement and precision, on the GPU tracks and the fallback (always CPU)."""
    model = MODELS[name]
    uri = contract.runtime_model_uri(make_spec(model={"name": "m", "version": "1", **model}).model)
    disagreements = []
    for precision in PRECISIONS:
        for placement, device in PLACEMENTS:
            runtime = placement | {"backend": backend, "precision": precision}
            expected = _runtime_refuses(uri, backend, precision, device)
            if _operator_refuses(model, runtime=runtime) != expected:
                disagreements.append(("runtime", runtime, expected))
        fallback = {"enabled": True, "backend": backend, "precision": precision}
        expected = _runtime_refuses(uri, backend, precision, "cpu")
        if _operator_refuses(model, fallback=fallback) != expected:
            disagreements.append(("fallback", fallback, expected))
    assert not disagreements, f"{uri}: (track, section, runtime refuses) {disagreements}"


def test_rendered_backend_and_precision_parse_into_the_runtime_config() -> None:
    """Each track's --backend and --precision reach the runtime's config; auto renders none."""
    spec = make_spec(
        model={"name": "m", "version": "1", "uri": "builtin://minilm-l6"},
        runtime={"backend": "torch", "precision": "bf16"},
        fallback={"enabled": True, "backend": "onnxruntime", "precision": "int8"},
    )
    default = make_spec(fallback={"enabled": True})
    seen: dict[Track, tuple[str, str]] = {}
    for plan in plan_tracks(spec, InferenceServiceStatus()):
        config = parse_config(runtime_args(plan))
        seen[plan.config.track] = (config.backend, config.precision)
    assert seen == {Track.STABLE: ("torch", "bf16"), Track.FALLBACK: ("onnxruntime", "int8")}
    for plan in plan_tracks(default, InferenceServiceStatus()):
        assert parse_config(runtime_args(plan)).backend == "auto"
