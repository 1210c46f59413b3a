"""Unpack a `.tar`, `.tar.gz`/`.tgz` or `.zip` into the staging directory, refusing what is unsafe.

Only regular files and directories are unpacked. Refused, as InvalidArchive: a member whose
path leaves the model directory (absolute, `..`; `staging` checks every path), a symbolic or
hard link, a device, a FIFO, more members than `max_members`, a truncated or corrupt archive.
The bytes unpacked are charged to the budget as they are written, after each member's
declared size was checked against it, so an archive that inflates past `--max-bytes` (a zip
bomb) stops there with ModelTooLarge. Nothing is unpacked by the libraries' `extractall`.
"""

from __future__ import annotations

import gzip
import lzma
import stat
import tarfile
import zipfile
import zlib
from enum import Enum
from pathlib import Path

from fleetserve_runtime.storage.budget import ByteBudget, metered
from fleetserve_runtime.storage.reasons import FetchFailed, Reason
from fleetserve_runtime.storage.staging import Staging, chunks_of, safe_relative_path

__all__ = ["ArchiveKind", "archive_kind", "unpack"]

_CORRUPT = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    lzma.LZMAError,
)
"""What the archive libraries raise on a truncated or corrupt archive."""


class ArchiveKind(Enum):
    """The archive formats unpacked (tar covers its gzip-compressed form)."""

    TAR = "tar"
    ZIP = "zip"


def archive_kind(filename: str) -> ArchiveKind | None:
    """The kind of archive `filename` names by its suffix, or None for a plain file."""
    lowered = filename.lower()
    if lowered.endswith((".tar", ".tar.gz", ".tgz")):
        return ArchiveKind.TAR
    if lowered.endswith(".zip"):
        return ArchiveKind.ZIP
    return None


def unpack(
    archive: Path, kind: ArchiveKind, staging: Staging, budget: ByteBudget, max_members: int
) -> None:
    """Unpack `archive` into `staging`, within `budget` and `max_members`."""
    try:
        if kind is ArchiveKind.TAR:
            _unpack_tar(archive, staging, budget, max_members)
        else:
            _unpack_zip(archive, staging, budget, max_members)
    except _CORRUPT as exc:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE,
            f"{archive.name} is truncated or corrupt ({type(exc).__name__}: {exc})",
        ) from exc
    except (NotImplementedError, RuntimeError) as exc:
        # zipfile: an unsupported compression method, an encrypted member.
        raise FetchFailed(Reason.INVALID_ARCHIVE, f"{archive.name}: {exc}") from exc


def _unpack_tar(archive: Path, staging: Staging, budget: ByteBudget, max_members: int) -> None:
    with tarfile.open(archive, mode="r:*") as tar:
        for count, member in enumerate(tar, start=1):
            _check_count(count, max_members, archive)
            if member.isdir():
                _check_directory(member.name)
                continue
            if not member.isfile():
                raise _not_regular(member.name, _tar_kind(member))
            budget.check_declared(member.size, f"the member {member.name!r}")
            source = tar.extractfile(member)
            if source is None:
                raise _not_regular(member.name, "not a regular file")
            with source:
                staging.write(member.name, metered(chunks_of(source), budget))


def _unpack_zip(archive: Path, staging: Staging, budget: ByteBudget, max_members: int) -> None:
    with zipfile.ZipFile(archive) as bundle:
        members = bundle.infolist()
        _check_count(len(members), max_members, archive)
        for member in members:
            # A Unix entry's file type; writers often leave it 0 for a regular file.
            file_type = stat.S_IFMT(member.external_attr >> 16) if member.create_system == 3 else 0
            if member.is_dir():
                _check_directory(member.filename)
                continue
            if file_type not in (0, stat.S_IFREG):
                link = file_type == stat.S_IFLNK
                raise _not_regular(
                    member.filename, "a symbolic link" if link else "not a regular file"
                )
            budget.check_declared(member.file_size, f"the member {member.filename!r}")
            with bundle.open(member) as source:
                staging.write(member.filename, metered(chunks_of(source), budget))


def _check_directory(name: str) -> None:
    """Refuse a directory member outside the model (files inside create their directories)."""
    path = name.rstrip("/")
    if path not in ("", "."):
        safe_relative_path(path)


def _check_count(count: int, max_members: int, archive: Path) -> None:
    if count > max_members:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE,
            f"{archive.name} holds more than {max_members} members (--max-files)",
        )


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"a hard link to {member.linkname!r}"
    if member.isdev():
        return "a device or a FIFO"
    return "not a regular file"


def _not_regular(name: str, kind: str) -> FetchFailed:
    return FetchFailed(
        Reason.INVALID_ARCHIVE, f"the member {name!r} is {kind}: only regular files are unpacked"
    )
