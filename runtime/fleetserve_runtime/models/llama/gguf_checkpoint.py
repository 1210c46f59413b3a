"""A GGUF file to a `Checkpoint`, read with llama.cpp's own `gguf` reader.

The metadata is bounded first (`gguf_bounds`); the architecture then comes from the `llama.*`
keys and the tokenizer from the `tokenizer.ggml.*` keys, and the tensors become weights in
`gguf_weights`. A file without `output.weight` ties the output layer to the embedding.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf

from fleetserve_runtime.models.llama.checkpoint_checks import check_weights, checked_config
from fleetserve_runtime.models.llama.config import Checkpoint, LlamaConfig
from fleetserve_runtime.models.llama.gguf_bounds import check_gguf_metadata
from fleetserve_runtime.models.llama.gguf_weights import gguf_weights
from fleetserve_runtime.models.llama.tokenizer import GgufVocabulary, gguf_tokenizer

__all__ = ["load_gguf"]

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


def load_gguf(path: Path) -> Checkpoint:
    """The checkpoint in GGUF file `path`; a `ValueError` names the file and the problem."""
    try:
        check_gguf_metadata(path)
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


def _gguf_checkpoint(reader: gguf.GGUFReader, *, source: str) -> Checkpoint:
    metadata = _GgufMetadata(reader)
    architecture = metadata.string("general.architecture")
    # A Mixtral file calls itself "llama" too; its experts are not a dense Llama.
    if architecture != "llama" or metadata.integer("llama.expert_count", 0) > 0:
        raise ValueError(f"GGUF architecture {architecture!r} is not supported; only dense 'llama'")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = _gguf_config(metadata, tie_word_embeddings="output.weight" not in tensors)
    codec = gguf_tokenizer(_gguf_vocabulary(metadata))
    weights = gguf_weights(tensors, config)
    check_weights(config, weights)
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
        value: str = self._typed(key, default, (str,), "a string")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        value: int = self._typed(key, default, (int,), "an integer")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        return float(self._typed(key, default, (int, float), "a number"))

    def flag(self, key: str, default: bool) -> bool:
        if key not in self._fields:
            return default
        return bool(self.value(key))

    def optional_id(self, key: str) -> int | None:
        return self.integer(key) if key in self._fields else None

    def sequence(self, key: str) -> list[Any]:
        value: list[Any] = self._typed(key, None, (list,), "an array")
        return value

    def _typed(self, key: str, default: object, kinds: tuple[type, ...], what: str) -> Any:
        """`key`'s value, refused unless one of `kinds`; `default` where given and `key` is absent.

        A bool is refused whatever `kinds` say: GGUF's bool is no integer or number.
        """
        if default is not None and key not in self._fields:
            return default
        value = self.value(key)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise ValueError(f"GGUF metadata {key} is not {what}")
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
    return checked_config(
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
