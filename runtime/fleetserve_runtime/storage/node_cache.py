"""A node's cache of fetched models, keyed by digest, so a second pod on the node skips the store.

`--cache-dir` names a directory every fetch on the node shares (a hostPath the operator mounts
for `spec.model.cache: node`). An entry is `sha256-<hex>/` under it, holding `model/` and
`model.json` exactly as an install lays them out (`install`), for the digest the spec pins.

- `restore` copies an entry into the fetch's staging directory, hashing every byte on the way,
  and uses it only when each file matches its record and the files' tree digest matches the
  record's; for `s3://` and `hf://` models, whose digest is the tree digest, that is the pinned
  digest itself. A bad or half-written entry is passed over (and removed when it can be): the
  fetch then downloads as if there were no cache.
- `publish` copies a finished install into `.tmp-<random>/` beside the entries, then renames
  it into place: readers never see half an entry, and of two pods publishing one digest the
  second finds the entry there and drops its copy.

The cache never fails a fetch: a directory that cannot be read or written is reported in the
result (`CacheOutcome.UNWRITABLE`) and the model is fetched from the store. Trust: an entry for
an `oci://` or `https://` pin is checked against its own record, not against the store's
digest (the installed files are not what the manifest or archive digest hashes), so the
directory must be writable only by the fetch's user, as the operator's hostPath is.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from enum import StrEnum
from pathlib import Path

from pydantic import ValidationError

from fleetserve_runtime.storage.digests import Digest, FileEntry, tree_digest
from fleetserve_runtime.storage.install import MODEL_DIR, RECORD_FILE, InstallRecord

__all__ = ["CacheOutcome", "entry_name", "publish", "restore"]

_CHUNK = 1 << 20


class CacheOutcome(StrEnum):
    """What the node cache did for one fetch (reported in its result)."""

    HIT = "hit"
    """The model came from the cache; the store was not asked."""
    STORED = "stored"
    """Fetched from the store, then published to the cache."""
    PRESENT = "present"
    """Fetched from the store; another pod had published the same digest meanwhile."""
    UNWRITABLE = "unwritable"
    """Fetched from the store; the cache directory could not be read or written."""


def entry_name(digest: Digest) -> str:
    """The entry's directory name: `sha256-<hex>` (no `:`, which some file systems refuse)."""
    return f"sha256-{digest.hex}"


def restore(cache_dir: Path, digest: Digest, staging: Path) -> InstallRecord | None:
    """Copy the entry for `digest` into `staging` after checking every byte; its record, or None.

    `staging` must be empty; on a miss or a bad entry it is left empty again.
    """
    entry = cache_dir / entry_name(digest)
    try:
        record = InstallRecord.model_validate_json((entry / RECORD_FILE).read_bytes())
    except (OSError, ValidationError):
        return None
    if record.digest != str(digest) or not _copy_checked(entry / MODEL_DIR, staging, record):
        _clear(staging)
        shutil.rmtree(entry, ignore_errors=True)
        return None
    return record


def publish(cache_dir: Path, dest: Path, record: InstallRecord) -> CacheOutcome:
    """Publish the install in `dest` (its `model/` and `record`) as the entry for its digest."""
    entry = cache_dir / entry_name(Digest.parse(record.digest))
    if (entry / RECORD_FILE).is_file():
        return CacheOutcome.PRESENT
    pending = cache_dir / f".tmp-{secrets.token_hex(8)}"
    try:
        shutil.copytree(dest / MODEL_DIR, pending / MODEL_DIR, symlinks=False)
        (pending / RECORD_FILE).write_text(record.model_dump_json(indent=1))
        os.rename(pending, entry)
    except OSError:
        shutil.rmtree(pending, ignore_errors=True)
        return CacheOutcome.PRESENT if entry.is_dir() else CacheOutcome.UNWRITABLE
    return CacheOutcome.STORED


def _copy_checked(source: Path, staging: Path, record: InstallRecord) -> bool:
    """Copy each recorded file, hashing it; False at the first file that differs."""
    entries: list[FileEntry] = []
    for file in record.files:
        target = staging / file.path
        if not _inside(staging, target):
            return False
        if (source / file.path).is_symlink():
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        try:
            with (source / file.path).open("rb") as reader, target.open("xb") as writer:
                while chunk := reader.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    writer.write(chunk)
        except OSError:
            return False
        if size != file.size or digest.hexdigest() != file.sha256:
            return False
        entries.append(FileEntry(file.path, size, file.sha256))
    return bool(entries) and str(tree_digest(entries)) == record.tree_digest


def _inside(root: Path, path: Path) -> bool:
    return os.path.normpath(path).startswith(os.path.normpath(root) + os.sep)


def _clear(staging: Path) -> None:
    for child in staging.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
