"""The bounds on a GGUF file's metadata, checked before llama.cpp's `gguf` reader reads it.

`GGUFReader` trusts every count it reads, so a hostile file could make it loop or allocate
without end; `check_gguf_metadata` walks the same layout first, reading only counts and
lengths.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import gguf
import numpy as np

__all__ = [
    "MAX_GGUF_ARRAY_LENGTH",
    "MAX_GGUF_METADATA_ENTRIES",
    "MAX_GGUF_METADATA_VALUES",
    "MAX_GGUF_STRING_BYTES",
    "check_gguf_metadata",
]

MAX_GGUF_METADATA_ENTRIES = 65_536
"""Most key-value entries a GGUF file may declare; llama.cpp's files carry about 50."""
MAX_GGUF_STRING_BYTES = 1 << 20
"""Longest GGUF metadata string (a key, a value, one array item); chat templates are the
longest real ones, tens of KB."""
MAX_GGUF_ARRAY_LENGTH = 1 << 20
"""Most items in one GGUF metadata array; the largest vocabularies have about 262k tokens."""
MAX_GGUF_METADATA_VALUES = 1 << 22
"""Most array items in all of a GGUF file's metadata together; Llama 3 has about 540k."""


def check_gguf_metadata(path: Path) -> None:
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
