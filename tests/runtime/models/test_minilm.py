"""Tests of the MiniLM handler: real weights, both batch layouts, and input validation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
import torch

from fleetserve_runtime.core.errors import InputTooLong, InvalidInput
from fleetserve_runtime.models.base import BatchLayout, CollateContext, ModelHandler, PreparedInput
from fleetserve_runtime.models.bert import PackedBatch
from fleetserve_runtime.models.minilm import EMBEDDING_DIM, FLOPS_PER_TOKEN, MiniLMHandler

CPU = torch.device("cpu")

TEXTS = (
    "A man is eating food.",
    "hi",
    "The new movie is awesome and everybody should watch it twice.",
    "How do I reset my password?",
    "Kubernetes schedules pods onto nodes according to their resource requests and limits.",
    "cheap flights to lisbon",
)


class TorchAllocator:
    """Hands out fresh `torch.empty` tensors, filled with garbage to catch unread-slot bugs."""

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Return an uninitialised tensor (poisoned where the dtype allows it)."""
        tensor = torch.empty(shape, dtype=dtype)
        if dtype.is_floating_point:
            tensor.fill_(float("nan"))
        elif dtype != torch.bool:
            tensor.fill_(-1)
        return tensor


def on_cpu(layout: BatchLayout) -> CollateContext:
    """`layout` on the CPU, in fresh poisoned buffers."""
    return CollateContext(layout, TorchAllocator(), CPU)


@pytest.fixture(scope="module")
def handler() -> MiniLMHandler:
    """Load the real model once for the whole module."""
    loaded = MiniLMHandler("minilm", "1")
    loaded.load(CPU)
    return loaded


def embed(
    handler: MiniLMHandler,
    items: Sequence[PreparedInput],
    *,
    packed: bool = True,
    pad_to: int | None = None,
) -> list[npt.NDArray[np.float32]]:
    """Run items through collate, forward and postprocess in one batch."""
    layout = BatchLayout(pad_to=pad_to or max(item.length for item in items), packed=packed)
    batch = handler.collate(items, on_cpu(layout))
    return handler.postprocess(handler.forward(batch), len(items))


def encode(handler: MiniLMHandler, texts: Sequence[str]) -> list[npt.NDArray[np.float32]]:
    """Embed texts in one packed batch."""
    return embed(handler, [handler.preprocess(text, truncate=False) for text in texts])


def test_handler_satisfies_protocol(handler: MiniLMHandler) -> None:
    """The handler is a `ModelHandler` with the advertised metadata."""
    assert isinstance(handler, ModelHandler)
    assert handler.metadata.platform == "pytorch"
    assert handler.metadata.outputs[0].shape == (-1, EMBEDDING_DIM)
    assert handler.metadata.max_sequence_length == 256


@pytest.mark.parametrize(
    ("anchor", "paraphrase", "unrelated"),
    [
        pytest.param(
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The stock market fell sharply today.",
            id="eating",
        ),
        pytest.param(
            "How do I reset my password?",
            "I forgot my password, how can I change it?",
            "What is the capital of France?",
            id="password",
        ),
        pytest.param(
            "The cat sits on the mat.",
            "A kitten is sitting on a rug.",
            "Quantum computers use qubits.",
            id="cat",
        ),
        pytest.param(
            "cheap flights to lisbon",
            "low-cost airline tickets to Lisbon, Portugal",
            "how to bake sourdough bread",
            id="flights",
        ),
    ],
)
def test_paraphrase_scores_above_unrelated(
    handler: MiniLMHandler, anchor: str, paraphrase: str, unrelated: str
) -> None:
    """A paraphrase is closer (cosine) to its anchor than an unrelated sentence is."""
    a, p, u = encode(handler, [anchor, paraphrase, unrelated])
    assert float(a @ p) > float(a @ u) + 0.2


def test_embeddings_are_unit_norm_384(handler: MiniLMHandler) -> None:
    """Every embedding is a float32 vector of 384 with L2 norm 1."""
    for vector in encode(handler, TEXTS):
        assert vector.shape == (EMBEDDING_DIM,)
        assert vector.dtype == np.float32
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


# Lengths that pack into three attention groups: one padded (5s and 7s), two exact.
GROUPED_LENGTHS = (50, 5, 7, 30, 5, 7, 50, 30) + (5, 7) * 8 + (30, 50) * 3


def sample_items(handler: MiniLMHandler, lengths: Sequence[int]) -> list[PreparedInput]:
    """Prepare distinct synthetic texts of exactly the given token lengths."""
    return [
        handler.preprocess(f"{index} {handler.sample_instance(length - 1)}", truncate=False)
        for index, length in enumerate(lengths)
    ]


def test_packed_batch_groups_by_length(handler: MiniLMHandler) -> None:
    """A mixed batch attends in several groups, padded only where lengths differ."""
    items = sample_items(handler, GROUPED_LENGTHS)
    assert [item.length for item in items] == list(GROUPED_LENGTHS)
    batch = handler.collate(items, on_cpu(BatchLayout(pad_to=max(GROUPED_LENGTHS))))
    assert isinstance(batch, PackedBatch)
    shapes = [(group.batch_size, group.length, group.padding is None) for group in batch.groups]
    assert shapes == [(20, 7, False), (5, 30, True), (5, 50, True)]


def assert_layouts_agree(handler: MiniLMHandler, items: Sequence[PreparedInput]) -> None:
    """Check packed, padded (tight and over-padded) and one-by-one embeddings match."""
    packed = np.stack(embed(handler, items))
    padded = np.stack(embed(handler, items, packed=False))
    over_padded = np.stack(embed(handler, items, packed=False, pad_to=300))
    alone = np.stack([embed(handler, [item])[0] for item in items])
    np.testing.assert_allclose(padded, packed, rtol=0, atol=1e-5)
    np.testing.assert_allclose(over_padded, packed, rtol=0, atol=1e-5)
    np.testing.assert_allclose(alone, packed, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "texts",
    [
        pytest.param(TEXTS, id="mixed-lengths"),
        pytest.param(("one two three", "four five six"), id="equal-lengths"),
    ],
)
def test_layouts_agree(handler: MiniLMHandler, texts: Sequence[str]) -> None:
    """Packed, padded (tight and over-padded) and batch-of-one give the same embeddings."""
    assert_layouts_agree(handler, [handler.preprocess(text, truncate=False) for text in texts])


def test_grouped_layouts_agree(handler: MiniLMHandler) -> None:
    """A batch packed into several attention groups matches the padded and one-by-one runs."""
    assert_layouts_agree(handler, sample_items(handler, GROUPED_LENGTHS))


def test_batch_order_is_kept(handler: MiniLMHandler) -> None:
    """Reversing a packed batch reverses its embeddings and changes nothing else."""
    forward = np.stack(encode(handler, TEXTS))
    backward = np.stack(encode(handler, TEXTS[::-1]))
    np.testing.assert_allclose(backward[::-1], forward, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "instance",
    [
        pytest.param(None, id="none"),
        pytest.param(42, id="int"),
        pytest.param(b"bytes", id="bytes"),
        pytest.param(["a list"], id="list"),
    ],
)
def test_preprocess_rejects_non_strings(handler: MiniLMHandler, instance: object) -> None:
    """A non-string instance is InvalidInput naming the type it got."""
    with pytest.raises(InvalidInput, match=f"must be a string, got {type(instance).__name__}"):
        handler.preprocess(instance, truncate=False)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param("", "empty string", id="empty"),
        pytest.param(" \t\n", "no tokens", id="whitespace"),
    ],
)
def test_preprocess_rejects_empty_text(handler: MiniLMHandler, text: str, match: str) -> None:
    """An empty or whitespace-only string is InvalidInput."""
    with pytest.raises(InvalidInput, match=match):
        handler.preprocess(text, truncate=False)


def test_preprocess_counts_special_tokens(handler: MiniLMHandler) -> None:
    """Length counts [CLS] and [SEP] and the ids are plain ints for the event loop."""
    prepared = handler.preprocess("hello world", truncate=False)
    assert prepared.length == 4
    assert list(prepared.data) == [101, 7592, 2088, 102]
    assert not prepared.truncated


def test_too_long_raises_with_limit(handler: MiniLMHandler) -> None:
    """Text beyond max_sequence_length is InputTooLong naming both counts."""
    with pytest.raises(InputTooLong, match=r"302 tokens exceeds max_sequence_length 256"):
        handler.preprocess("word " * 300, truncate=False)


def test_truncate_keeps_sep_and_marks_truncated(handler: MiniLMHandler) -> None:
    """With truncate=True a long text is cut to the limit, still ends in [SEP], and embeds."""
    prepared = handler.preprocess("word " * 300, truncate=True)
    assert prepared.truncated
    assert prepared.length == len(prepared.data) == 256
    assert prepared.data[0] == 101
    assert prepared.data[-1] == 102
    (vector,) = embed(handler, [prepared])
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("length", [3, 12, 55, 256])
def test_sample_instance_has_requested_length(handler: MiniLMHandler, length: int) -> None:
    """A sample instance tokenises to exactly the requested number of tokens."""
    sample = handler.sample_instance(length)
    assert handler.preprocess(sample, truncate=False).length == length


def test_flops_per_token_matches_config(handler: MiniLMHandler) -> None:
    """The published constant equals the FLOPs derived from the shipped config."""
    assert handler.encoder.config.dense_flops_per_token == FLOPS_PER_TOKEN == 21_233_664


@pytest.mark.parametrize("limit", [2, 513])
def test_max_sequence_length_is_bounded(limit: int) -> None:
    """A limit outside what the position embeddings allow is refused at construction."""
    with pytest.raises(ValueError, match="max_sequence_length"):
        MiniLMHandler("minilm", "1", max_sequence_length=limit)
