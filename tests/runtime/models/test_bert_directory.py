"""A sentence-transformers directory served over HTTP embeds as sentence-transformers does.

The built-in MiniLM's files are laid out again in a temp directory, as a user brings a model
(`relay_minilm`), and served by the real `fleetserve-runtime serve` as `file://<directory>`;
the embeddings that come back over loopback are compared with `SentenceTransformer(<that
directory>)`'s, loaded from the same files (nothing is downloaded). Its embeddings are kept
as references on disk (`reference_cache`), keyed by the files, the texts and the versions.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import pytest

from tests.runtime.models.bert_directories import CLS, MEAN, relay_minilm
from tests.runtime.models.cli_server import embeddings, serving
from tests.runtime.reference_cache import cached_reference, file_sha256

TEXTS = [
    "hi",
    "A man is eating food.",
    "How do I reset my password if I no longer have access to my email?",
    (
        "Kubernetes schedules pods onto nodes according to their resource requests, and the "
        "kubelet on each node starts the containers, restarts them when they fail and reports "
        "their status back to the API server, which keeps the desired state in etcd."
    ),
    "The river runs to the sea past the old mill and the church. " * 30,
]
"""One to well over 256 tokens: the last is cut to the model's limit on both sides."""
DIGEST = "sha256:" + "ab" * 32


def reference_embeddings(directory: Path, texts: Sequence[str]) -> list[list[float]]:
    """`SentenceTransformer(directory)`'s embeddings of `texts`, on the CPU, in fp32."""
    with warnings.catch_warnings():
        # Its imports and loaders warn about their own deprecations; none concerns this.
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(directory), device="cpu")
        vectors = model.encode(list(texts), batch_size=len(texts), convert_to_numpy=True)
    return [[float(value) for value in row] for row in vectors]


def st_embeddings(directory: Path) -> npt.NDArray[np.float32]:
    """`reference_embeddings` of `TEXTS`, from the reference cache when it holds them."""
    configs = {
        str(path.relative_to(directory)): path.read_text()
        for path in sorted(directory.rglob("*.json"))
        if path.name != "tokenizer.json"
    }
    inputs = {
        "weights": file_sha256(directory / "model.safetensors"),
        "tokenizer": file_sha256(directory / "tokenizer.json"),
        "configs": configs,
        "normalize": (directory / "2_Normalize").is_dir(),
        "texts": TEXTS,
        "sentence_transformers": importlib.metadata.version("sentence-transformers"),
        "recipe": inspect.getsource(reference_embeddings),
    }
    stored = cached_reference(
        "sentence-transformers-embeddings",
        inputs,
        lambda: reference_embeddings(directory, TEXTS),
    )
    return np.asarray(stored, dtype=np.float32)


def cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Row-wise cosine similarity."""
    dots = (a * b).sum(axis=1)
    norms: npt.NDArray[np.float32] = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return dots / norms


def served(
    directory: Path, log: Path, *flags: str
) -> tuple[npt.NDArray[np.float32], dict[str, object]]:
    """The runtime's embeddings of `TEXTS` serving `directory`, and its model metadata."""
    with serving(f"file://{directory}", "st", log, "--no-warmup", "--task", "embed", *flags) as url:
        vectors = embeddings(url, "st", TEXTS)
        metadata: dict[str, object] = httpx.get(f"{url}/v2/models/st", timeout=10).json()
    return vectors, metadata


@pytest.mark.timeout(300)
def test_a_sentence_transformers_directory_embeds_as_sentence_transformers(tmp_path: Path) -> None:
    """Mean pooling and Normalize, as MiniLM ships: cosine ≥ 0.9999 per text, unit norm.

    The fetch flags the operator passes come back in the metadata's `source`.
    """
    directory = relay_minilm(tmp_path / "minilm", pooling=MEAN, normalize=True)
    facts = "commit=3f2a9c1,data=wiki-2024-06"
    vectors, metadata = served(
        directory,
        tmp_path / "log",
        *("--model-source", "s3://models/minilm/v3", "--model-digest", DIGEST),
        *("--model-metadata", facts),
    )
    reference = st_embeddings(directory)
    assert vectors.shape == reference.shape == (len(TEXTS), 384)
    assert cosines(vectors, reference).min() >= 0.9999
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    parameters = metadata["parameters"]
    assert isinstance(parameters, Mapping)
    assert parameters["max_sequence_length"] == 256
    assert parameters["source"] == {
        "uri": "s3://models/minilm/v3",
        "digest": DIGEST,
        "metadata": {"commit": "3f2a9c1", "data": "wiki-2024-06"},
    }


@pytest.mark.timeout(300)
def test_cls_pooling_without_normalize_embeds_as_sentence_transformers(tmp_path: Path) -> None:
    """CLS pooling, no Normalize and a 128-token limit: the same vectors, lengths included."""
    directory = relay_minilm(tmp_path / "cls", pooling=CLS, normalize=False, max_seq_length=128)
    vectors, metadata = served(directory, tmp_path / "log", "--max-sequence-length", "256")
    reference = st_embeddings(directory)
    assert cosines(vectors, reference).min() >= 0.9999
    norms = np.linalg.norm(vectors, axis=1)
    assert np.allclose(norms, np.linalg.norm(reference, axis=1), rtol=1e-4)
    assert norms.min() > 2.0
    parameters = metadata["parameters"]
    assert isinstance(parameters, Mapping)
    assert parameters["max_sequence_length"] == 128
    assert parameters["source"] == {"uri": f"file://{directory}", "digest": None, "metadata": {}}
