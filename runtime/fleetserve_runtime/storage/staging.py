"""The directory a fetch fills before it is installed: every file enters through `Staging`.

A file's path is taken as the store or the archive names it, and must stay inside: relative,
no `.` or `..` part, no empty part, no backslash, no control character (`./` in front is
dropped, as tar writes it). No path may come twice, and none may be both a file and a
directory. Each file is hashed as it is written, so the tree digest and the install record
need no second read. Thread-safe: parallel downloads write into one `Staging`.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from fleetserve_runtime.storage.digests import FileEntry
from fleetserve_runtime.storage.reasons import FetchFailed, Reason

__all__ = ["CHUNK_BYTES", "Staging", "chunks_of", "safe_relative_path"]

CHUNK_BYTES = 1 << 20
"""Bytes read or written at a time."""

_MAX_PATH_BYTES = 4096
_MAX_PART_BYTES = 255
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")


def safe_relative_path(name: str) -> str:
    """`name` as a path inside the model directory; InvalidArchive naming it otherwise."""
    path = name
    while path.startswith("./"):
        path = path[2:]
    parts = path.split("/")
    if not path:
        problem = "is empty"
    elif path.startswith("/"):
        problem = "is absolute"
    elif _FORBIDDEN.search(path):
        problem = "holds a control character or a backslash"
    elif any(part in ("", ".", "..") for part in parts):
        problem = "has an empty, '.' or '..' part"
    elif len(path.encode()) > _MAX_PATH_BYTES or any(
        len(part.encode()) > _MAX_PART_BYTES for part in parts
    ):
        problem = "is too long"
    else:
        return path
    raise FetchFailed(
        Reason.INVALID_ARCHIVE,
        f"the path {name!r} {problem}: every file must land inside the model directory",
    )


def chunks_of(stream: IO[bytes]) -> Iterator[bytes]:
    """The bytes of an open binary stream, `CHUNK_BYTES` at a time."""
    while chunk := stream.read(CHUNK_BYTES):
        yield chunk


class Staging:
    """The files fetched so far under `root`, with their sizes and SHA-256."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._entries: dict[str, FileEntry] = {}
        self._claimed: set[str] = set()
        self._lock = threading.Lock()

    def write(self, name: str, chunks: Iterable[bytes]) -> FileEntry:
        """Write a new file at `name` from `chunks`, hashing it on the way."""
        path = self._claim(name)
        target = self._prepare(path)
        hasher = hashlib.sha256()
        size = 0
        try:
            out = target.open("xb")
        except (FileExistsError, IsADirectoryError) as exc:
            raise _collision(path) from exc
        with out:
            for chunk in chunks:
                out.write(chunk)
                hasher.update(chunk)
                size += len(chunk)
        return self._record(FileEntry(path, size, hasher.hexdigest()))

    def adopt(self, name: str, source: Path, sha256: str) -> FileEntry:
        """Move `source` (on this volume, already hashed as `sha256`) in as the file `name`."""
        path = self._claim(name)
        target = self._prepare(path)
        if target.exists():
            raise _collision(path)
        size = source.stat().st_size
        os.replace(source, target)
        return self._record(FileEntry(path, size, sha256))

    def entries(self) -> list[FileEntry]:
        """The files written, sorted by path."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.path.encode())

    def _claim(self, name: str) -> str:
        path = safe_relative_path(name)
        with self._lock:
            if path in self._claimed:
                raise FetchFailed(Reason.INVALID_ARCHIVE, f"the path {path!r} comes twice")
            self._claimed.add(path)
        return path

    def _prepare(self, path: str) -> Path:
        target = self.root / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise _collision(path) from exc
        return target

    def _record(self, entry: FileEntry) -> FileEntry:
        with self._lock:
            self._entries[entry.path] = entry
        return entry


def _collision(path: str) -> FetchFailed:
    return FetchFailed(
        Reason.INVALID_ARCHIVE, f"the path {path!r} is both a file and a directory of the model"
    )
