"""Content digests: `sha256:<hex>` values, and the tree digest of a model directory.

Stores that name no digest for a whole model (S3 prefixes, Hugging Face revisions, the files
an archive unpacks to) get the tree digest of the files fetched: SHA-256 over one line per
regular file, sorted by the UTF-8 bytes of its relative POSIX path,

    <relative path> NUL <size in decimal> NUL <SHA-256 of the file, lowercase hex> LF

so two fetches agree exactly when they hold the same paths with the same bytes. Directories,
modes and times take no part. Paths never hold control characters (`staging` refuses them).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Digest", "FileEntry", "tree_digest"]

_SHA256 = re.compile(r"sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Digest:
    """A SHA-256 digest; `str()` gives `sha256:<64 lowercase hex>`."""

    hex: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{64}", self.hex):
            msg = f"not a SHA-256 digest: {self.hex!r}"
            raise ValueError(msg)

    @classmethod
    def parse(cls, text: str) -> Digest:
        """A digest from `sha256:<64 lowercase hex>`; ValueError naming the text otherwise."""
        match = _SHA256.fullmatch(text)
        if match is None:
            msg = f"{text!r} is not a digest of the form sha256:<64 lowercase hex digits>"
            raise ValueError(msg)
        return cls(match.group(1))

    def __str__(self) -> str:
        return f"sha256:{self.hex}"


@dataclass(frozen=True)
class FileEntry:
    """One fetched file: its path relative to the model directory, size and SHA-256 (hex)."""

    path: str
    size: int
    sha256: str


def tree_digest(entries: Iterable[FileEntry]) -> Digest:
    """The tree digest of these files (the module docstring gives the rule)."""
    listing = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.path.encode()):
        listing.update(f"{entry.path}\0{entry.size}\0{entry.sha256}\n".encode())
    return Digest(listing.hexdigest())
