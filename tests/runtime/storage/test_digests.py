"""Digests: the `sha256:` form, and the tree digest of a model directory (the documented rule)."""

from __future__ import annotations

import hashlib

import pytest

from fleetserve_runtime.storage.digests import Digest, FileEntry, tree_digest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_digest_form() -> None:
    """Only `sha256:` and 64 lowercase hex digits parse; `str` gives the form back."""
    text = "sha256:" + "0f" * 32
    assert str(Digest.parse(text)) == text
    for bad in ("sha256:" + "0F" * 32, "sha512:" + "0f" * 32, "0f" * 32, "sha256:0f"):
        with pytest.raises(ValueError, match="sha256:<64 lowercase hex"):
            Digest.parse(bad)


def test_tree_digest_is_the_documented_listing() -> None:
    """SHA-256 over `path NUL size NUL sha256 LF`, one line a file, by the paths' bytes."""
    files = {"b.txt": b"bee", "a/z.bin": b"\x00" * 3, "a/\u00e9.txt": b"e"}
    entries = [FileEntry(path, len(data), _sha(data)) for path, data in files.items()]
    ordered = sorted(files, key=str.encode)
    listing = b"".join(f"{p}\0{len(files[p])}\0{_sha(files[p])}\n".encode() for p in ordered)
    assert tree_digest(entries) == Digest(hashlib.sha256(listing).hexdigest())


def test_tree_digest_ignores_order_and_sees_every_field() -> None:
    """The digest ignores the entries' order; a changed path, size or content changes it."""
    a = FileEntry("a", 1, _sha(b"1"))
    b = FileEntry("b", 2, _sha(b"22"))
    base = tree_digest([a, b])
    assert tree_digest([b, a]) == base
    assert tree_digest([a, FileEntry("c", 2, b.sha256)]) != base
    assert tree_digest([a, FileEntry("b", 3, b.sha256)]) != base
    assert tree_digest([a, FileEntry("b", 2, _sha(b"23"))]) != base
    assert tree_digest([a]) != base
