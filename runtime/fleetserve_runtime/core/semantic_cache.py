"""Optional semantic cache of greedy generations: exact repeats first, then near paraphrases.

A greedy answer is a function of the prompt and the few parameters that shape it, so a
request may take the answer cached for an earlier one. Two ways, tried in turn:

- exact: the digest `cache.cache_key` computes over the model, the loaded version (label and
  load generation), the tenant, the prompt and the parameters;
- semantic: the prompt's embedding has cosine similarity at least `min_similarity` with a
  cached one's, among the entries of the same *partition*: same model, version, tenant and
  parameters. Each partition holds a matrix of unit-norm embeddings; the search is one
  matrix-vector product and its argmax, linear in the partition's size, which the cache's
  bounds keep small.

Entries are bounded by count and by bytes (the embedding, the answer and the key), and the
least recently used goes first. A partition names its version and tenant, so a new version
never answers from an old one's entries and a tenant never reads another's; `tenant=None`
is the untenanted partition, a partition of its own.

Only greedy decoding may be cached (the caller checks, `generate.contracts.is_greedy`): a
sampled answer is one draw among many, and serving it again would change the distribution
callers asked for.

Pure: numpy only, no asyncio, no threads; used from the event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from fleetserve_runtime.core.cache import cache_key

__all__ = ["Hit", "Partition", "Query", "SemanticCache"]

V = TypeVar("V")
Embedding = npt.NDArray[np.float32]
Partition = tuple[str, str, str | None, bytes]
"""(model, version, tenant, digest of the parameters): the entries a query may match."""

_SIMILARITY_SLACK = 1e-6
"""Float32 rounding: an identical embedding may score 0.99999994, and `min_similarity` 1.0
means identical."""
_INITIAL_ROWS = 8


@dataclass(frozen=True, slots=True)
class Query:
    """One cacheable request: whose it is, what it asks, and under which parameters.

    `params` holds everything besides the prompt that changes the answer (the output
    bound, stop strings, a chat's earlier messages); `prompt` is the input, hashed exactly
    as given for the exact key.
    """

    model: str
    version: str
    """The version label and its load generation (`label#generation`)."""
    tenant: str | None
    params: dict[str, Any]
    prompt: object

    def exact_key(self) -> bytes:
        """The exact-repeat digest (`cache_key`), the tenant part of the instance."""
        return cache_key(
            model=self.model,
            version=self.version,
            instance=[self.tenant, self.prompt],
            params=self.params,
        )

    def partition(self) -> Partition:
        """The entries a semantic lookup of this query may match."""
        digest = cache_key(
            model=self.model, version=self.version, instance=None, params=self.params
        )
        return (self.model, self.version, self.tenant, digest)


@dataclass(frozen=True, slots=True)
class Hit(Generic[V]):
    """A cached answer, and how it was found (`similarity` 1.0 for an exact hit)."""

    value: V
    exact: bool
    similarity: float


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    partition: Partition
    size: int
    embedded: bool


@dataclass(slots=True)
class _Rows:
    """One partition's unit-norm embeddings, a row per entry, packed (no holes)."""

    matrix: Embedding
    keys: list[bytes] = field(default_factory=list)
    index: dict[bytes, int] = field(default_factory=dict)

    def add(self, key: bytes, vector: Embedding) -> None:
        row = len(self.keys)
        if row == self.matrix.shape[0]:
            grown = np.empty((2 * row, self.matrix.shape[1]), dtype=np.float32)
            grown[:row] = self.matrix
            self.matrix = grown
        self.matrix[row] = vector
        self.keys.append(key)
        self.index[key] = row

    def remove(self, key: bytes) -> None:
        """Drop `key`'s row, moving the last row into its place."""
        row = self.index.pop(key)
        last = self.keys.pop()
        if last != key:
            self.matrix[row] = self.matrix[len(self.keys)]
            self.keys[row] = last
            self.index[last] = row

    def best(self, vector: Embedding) -> tuple[bytes, float]:
        scores = self.matrix[: len(self.keys)] @ vector
        row = int(np.argmax(scores))
        return self.keys[row], float(scores[row])


def _unit(embedding: npt.ArrayLike) -> Embedding | None:
    """`embedding` as a flat float32 unit vector; None when it has no direction."""
    vector = np.asarray(embedding, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(norm) or norm == 0.0:
        return None
    return vector / norm


class SemanticCache(Generic[V]):
    """Least-recently-used answers, found by exact key or by embedding similarity."""

    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        min_similarity: float,
        size_of: Callable[[V], int],
    ) -> None:
        """`size_of(value)`: the bytes an answer holds (its embedding is counted here)."""
        if not 0.0 < min_similarity <= 1.0:
            msg = f"min_similarity must be in (0, 1], got {min_similarity}"
            raise ValueError(msg)
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._min_similarity = min_similarity
        self._size_of = size_of
        self._entries: OrderedDict[bytes, _Entry[V]] = OrderedDict()
        self._rows: dict[Partition, _Rows] = {}
        self.bytes = 0

    def __len__(self) -> int:
        """Entries held."""
        return len(self._entries)

    def exact(self, query: Query) -> Hit[V] | None:
        """The answer cached for this very query (marked recently used), or None."""
        key = query.exact_key()
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return Hit(entry.value, exact=True, similarity=1.0)

    def similar(self, query: Query, embedding: npt.ArrayLike) -> Hit[V] | None:
        """The most similar answer of the query's partition, if at least `min_similarity`."""
        vector = _unit(embedding)
        rows = self._rows.get(query.partition())
        if vector is None or rows is None or rows.matrix.shape[1] != vector.shape[0]:
            return None
        key, score = rows.best(vector)
        if score < self._min_similarity - _SIMILARITY_SLACK:
            return None
        self._entries.move_to_end(key)
        return Hit(self._entries[key].value, exact=False, similarity=min(score, 1.0))

    def put(self, query: Query, embedding: npt.ArrayLike | None, value: V) -> None:
        """Store `value` for `query` (and its embedding, if any), evicting to stay bounded.

        Without an embedding (a prompt of token ids) the entry answers exact repeats only.
        An answer larger than the whole byte bound is not kept.
        """
        if self._max_entries <= 0 or self._max_bytes <= 0:
            return
        key = query.exact_key()
        partition = query.partition()
        self._remove(key)
        vector = None if embedding is None else _unit(embedding)
        rows = self._rows.get(partition)
        if vector is not None and rows is not None and rows.matrix.shape[1] != vector.shape[0]:
            vector = None  # another encoder's width: this partition cannot compare it
        size = len(key) + self._size_of(value) + (0 if vector is None else vector.nbytes)
        if size > self._max_bytes:
            return
        if vector is not None:
            if rows is None:
                rows = self._rows[partition] = _Rows(
                    np.empty((_INITIAL_ROWS, vector.shape[0]), dtype=np.float32)
                )
            rows.add(key, vector)
        self._entries[key] = _Entry(value, partition, size, embedded=vector is not None)
        self.bytes += size
        while len(self._entries) > self._max_entries or self.bytes > self._max_bytes:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self.bytes -= entry.size
        if entry.embedded:
            rows = self._rows[entry.partition]
            rows.remove(key)
            if not rows.keys:
                del self._rows[entry.partition]
