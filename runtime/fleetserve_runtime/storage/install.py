"""The destination volume's layout, and an install that is all or nothing.

- `model/`: the installed model, which the runtime serves (read-only) as `file://.../model`.
- `model.json`: its record (`InstallRecord`): the source URI, the digest, the tree digest,
  the byte count and every file with its size and SHA-256.
- `.fetch/`: the work area, there only while a fetch runs or after one failed: `staging/`
  (the model being fetched, emptied at every start) and `resume/` (what a retry continues:
  partial downloads, a scratch Hugging Face cache).

`commit` writes the record (to a temporary name, then renamed), then renames `staging` to
`model`: a model directory is never there without its record. `prepare` removes an install
that does not match, the record first, so a run cut short between the two leaves a model
without a record, which the next run removes. A failed fetch leaves nothing at `model`.
An init container that restarts after a finished install finds it with `installed` and
returns at once. One fetch at a time per volume (one init container writes it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from fleetserve_runtime.storage.digests import Digest, FileEntry

__all__ = [
    "MODEL_DIR",
    "RECORD_FILE",
    "WORK_DIR",
    "InstallRecord",
    "RecordedFile",
    "abandon",
    "commit",
    "finish",
    "installed",
    "prepare",
]

MODEL_DIR = "model"
RECORD_FILE = "model.json"
WORK_DIR = ".fetch"


class RecordedFile(BaseModel):
    """One installed file: path relative to `model/`, size in bytes, SHA-256 (hex)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: int
    sha256: str


class InstallRecord(BaseModel):
    """`model.json`: what was installed, from where, and its digests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal[1] = 1
    uri: str
    """The source URI, without URL queries (a presigned URL's signature is a credential)."""
    digest: str
    """The content digest: the manifest digest (oci), the file's SHA-256 (https), else the
    tree digest."""
    tree_digest: str
    """The tree digest of `model/` (`digests` gives the rule)."""
    bytes: int
    files: list[RecordedFile]

    @classmethod
    def of(
        cls, uri: str, digest: Digest, tree: Digest, entries: Sequence[FileEntry]
    ) -> InstallRecord:
        """The record of `entries` fetched from `uri`."""
        return cls(
            uri=uri,
            digest=str(digest),
            tree_digest=str(tree),
            bytes=sum(e.size for e in entries),
            files=[RecordedFile(path=e.path, size=e.size, sha256=e.sha256) for e in entries],
        )


def installed(
    dest: Path, *, uri: str, pins: Sequence[Digest], max_bytes: int | None
) -> InstallRecord | None:
    """The finished install of `uri` in `dest` matching every pin and the limit, or None.

    Each recorded file must still be there with its size; contents are not read again.
    """
    try:
        record = InstallRecord.model_validate_json((dest / RECORD_FILE).read_bytes())
    except (OSError, ValidationError):
        return None
    if record.uri != uri or any(record.digest != str(pin) for pin in pins):
        return None
    if max_bytes is not None and record.bytes > max_bytes:
        return None
    model = dest / MODEL_DIR
    for file in record.files:
        try:
            if (model / file.path).lstat().st_size != file.size:
                return None
        except OSError:
            return None
    return record


def prepare(dest: Path) -> tuple[Path, Path]:
    """Clear any install from `dest` and an empty staging directory; (staging, resume)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / RECORD_FILE).unlink(missing_ok=True)
    _remove(dest / MODEL_DIR)
    staging = dest / WORK_DIR / "staging"
    _remove(staging)
    staging.mkdir(parents=True)
    resume = dest / WORK_DIR / "resume"
    resume.mkdir(exist_ok=True)
    return staging, resume


def commit(dest: Path, staging: Path, record: InstallRecord) -> None:
    """Install `staging` as `dest/model` with its record (record first, then the model)."""
    pending = dest / f".{RECORD_FILE}.pending"
    with pending.open("wb") as out:
        out.write(record.model_dump_json(indent=1).encode())
        out.flush()
        os.fsync(out.fileno())
    os.replace(pending, dest / RECORD_FILE)
    os.rename(staging, dest / MODEL_DIR)
    directory = os.open(dest, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def abandon(dest: Path) -> None:
    """Remove what a failed fetch staged; keep what a retry can resume."""
    shutil.rmtree(dest / WORK_DIR / "staging", ignore_errors=True)


def finish(dest: Path) -> None:
    """Remove the work area after an install: the volume holds the model and its record."""
    shutil.rmtree(dest / WORK_DIR, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
