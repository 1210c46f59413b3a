"""Optional LRU result cache, bounded by entries and bytes, beside the request flow.

Keys hash the model name, the loaded version (label and load generation), the input in a
canonical encoding and the request parameters that change the result, so a version switch —
or a label reloaded from another URI — can never serve an old result. Used from
the event loop only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import orjson

__all__ = ["ResultCache", "cache_key"]


def cache_key(
    *,
    model: str,
    version: str,
    instance: object,
    params: dict[str, Any],
    tenant: str | None = None,
) -> bytes:
    """Digest identifying one instance's result under one model version and parameters.

    With a `tenant` (a server with tenants) the key is that tenant's alone: no tenant can
    learn from a cache hit's speed that another sent the same input.
    """
    # The instance is hashed exactly as given (canonical JSON, sorted keys): any further
    # normalisation could map inputs the model treats differently to one cached answer.
    key = [model, version, instance, params] + ([] if tenant is None else [tenant])
    blob = orjson.dumps(key, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return hashlib.blake2b(blob, digest_size=16).digest()


def _size_of(value: Any) -> int:
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    return len(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


class ResultCache:
    """Least-recently-used map from `cache_key` digests to results."""

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._entries: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()
        self.bytes = 0

    @property
    def enabled(self) -> bool:
        """False when configured with no capacity."""
        return self._max_entries > 0 and self._max_bytes > 0

    def __len__(self) -> int:
        """Entries held."""
        return len(self._entries)

    def get(self, key: bytes) -> Any | None:
        """The cached result (and mark it recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: bytes, value: Any) -> None:
        """Store `value`, evicting least-recently-used entries to stay within both bounds."""
        if not self.enabled:
            return
        size = _size_of(value)
        if size > self._max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._entries[key] = (value, size)
        self.bytes += size
        while len(self._entries) > self._max_entries or self.bytes > self._max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.bytes -= evicted
