"""Archives: tar and zip unpacked safely, hostile ones refused, inflation stopped at the budget.

Each hostile archive is built here, byte by byte where the libraries would not write it.
"""

from __future__ import annotations

import hashlib
import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from fleetserve_runtime.storage.archive import ArchiveKind, archive_kind, unpack
from fleetserve_runtime.storage.budget import ByteBudget
from fleetserve_runtime.storage.reasons import FetchFailed, Reason
from fleetserve_runtime.storage.staging import Staging


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                name, data = member
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _link(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _zip(path: Path, members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for info, data in members:
            bundle.writestr(info, data)
    return path


def _unpack(
    archive: Path, out: Path, *, limit: int | None = None, max_members: int = 100
) -> Staging:
    out.mkdir(parents=True)
    staging = Staging(out)
    kind = archive_kind(archive.name)
    assert kind is not None
    unpack(archive, kind, staging, ByteBudget(limit, "the model"), max_members)
    return staging


def _refused(archive: Path, out: Path, **limits: int) -> FetchFailed:
    with pytest.raises(FetchFailed) as failed:
        _unpack(archive, out, **limits)
    return failed.value


def test_kinds_by_suffix() -> None:
    """.tar, .tar.gz, .tgz and .zip are archives; anything else is one plain file."""
    assert archive_kind("m.tar") is ArchiveKind.TAR
    assert archive_kind("m.TAR.GZ") is ArchiveKind.TAR
    assert archive_kind("m.tgz") is ArchiveKind.TAR
    assert archive_kind("m.zip") is ArchiveKind.ZIP
    assert archive_kind("model.onnx") is None
    assert archive_kind("m.gz") is None


@pytest.mark.parametrize("name", ["model.tar", "model.tar.gz", "model.tgz"])
def test_tar_unpacks_files_with_their_hashes(tmp_path: Path, name: str) -> None:
    """Files land at their paths (`./` dropped, directories made), hashed as written."""
    mode = "w" if name.endswith(".tar") else "w:gz"
    root = tarfile.TarInfo("./")
    root.type = tarfile.DIRTYPE
    archive = _tar(
        tmp_path / name,
        [root, ("./config.json", b"{}"), ("weights/part-1.bin", b"\x01" * 5000)],
        mode,
    )
    staging = _unpack(archive, tmp_path / "out")
    assert (tmp_path / "out/config.json").read_bytes() == b"{}"
    assert (tmp_path / "out/weights/part-1.bin").read_bytes() == b"\x01" * 5000
    assert [(e.path, e.size, e.sha256) for e in staging.entries()] == [
        ("config.json", 2, hashlib.sha256(b"{}").hexdigest()),
        ("weights/part-1.bin", 5000, hashlib.sha256(b"\x01" * 5000).hexdigest()),
    ]


def test_zip_unpacks(tmp_path: Path) -> None:
    """A zip's files land at their paths; directory entries only make directories."""
    archive = _zip(tmp_path / "m.zip", [("d/", b""), ("d/a.txt", b"alpha"), ("b.txt", b"beta")])
    staging = _unpack(archive, tmp_path / "out")
    assert [e.path for e in staging.entries()] == ["b.txt", "d/a.txt"]
    assert (tmp_path / "out/d/a.txt").read_bytes() == b"alpha"


@pytest.mark.parametrize(
    ("member", "says"),
    [
        pytest.param(("../evil", b"x"), "'..' part", id="dot-dot"),
        pytest.param(("a/../../evil", b"x"), "'..' part", id="dot-dot-inside"),
        pytest.param(("/tmp/evil", b"x"), "absolute", id="absolute"),
        pytest.param(("a\\..\\evil", b"x"), "backslash", id="backslash"),
        pytest.param(("a\nb", b"x"), "control character", id="newline"),
        pytest.param(
            _link("escape", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link", id="symlink-out"
        ),
        pytest.param(
            _link("inner", tarfile.SYMTYPE, "config.json"), "symbolic link", id="symlink-in"
        ),
        pytest.param(_link("hard", tarfile.LNKTYPE, "config.json"), "hard link", id="hardlink"),
        pytest.param(_link("fifo", tarfile.FIFOTYPE), "device or a FIFO", id="fifo"),
        pytest.param(_link("null", tarfile.CHRTYPE), "device or a FIFO", id="char-device"),
        pytest.param(_link("disk", tarfile.BLKTYPE), "device or a FIFO", id="block-device"),
    ],
)
def test_hostile_tar_is_refused(
    tmp_path: Path, member: tarfile.TarInfo | tuple[str, bytes], says: str
) -> None:
    """Paths out of the model, links, devices and FIFOs are InvalidArchive; nothing escapes."""
    archive = _tar(tmp_path / "m.tar", [("config.json", b"{}"), member])
    failure = _refused(archive, tmp_path / "work" / "out")
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert says in failure.message
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "work" / "evil").exists()
    assert not Path("/tmp/evil").exists()


def test_hostile_zip_paths_are_refused(tmp_path: Path) -> None:
    """A zip member named `../evil` or `/abs` is InvalidArchive."""
    for name in ("../evil", "/abs/evil"):
        archive = _zip(tmp_path / "m.zip", [(name, b"x")])
        failure = _refused(archive, tmp_path / f"out{len(name)}")
        assert failure.reason is Reason.INVALID_ARCHIVE
    assert not (tmp_path / "evil").exists()


def test_zip_symlink_is_refused(tmp_path: Path) -> None:
    """A zip entry whose Unix mode is a symbolic link is InvalidArchive."""
    link = zipfile.ZipInfo("escape")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    archive = _zip(tmp_path / "m.zip", [(link, b"/etc/passwd")])
    failure = _refused(archive, tmp_path / "out")
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert "symbolic link" in failure.message
    assert not (tmp_path / "out/escape").exists()


def test_zip_bomb_stops_at_its_declared_size(tmp_path: Path) -> None:
    """A member declaring more than the budget is ModelTooLarge before it is inflated."""
    archive = _zip(tmp_path / "bomb.zip", [("zeros.bin", b"\0" * (4 << 20))])
    assert archive.stat().st_size < 64 << 10
    failure = _refused(archive, tmp_path / "out", limit=1 << 20)
    assert failure.reason is Reason.MODEL_TOO_LARGE
    assert not (tmp_path / "out/zeros.bin").exists()


def test_zip_member_lying_about_its_size_is_invalid(tmp_path: Path) -> None:
    """A member declaring 1 KiB but holding 4 MiB stops at 1 KiB and fails its CRC."""
    archive = _zip(tmp_path / "liar.zip", [("zeros.bin", b"\0" * (4 << 20))])
    data = bytearray(archive.read_bytes())
    real = (4 << 20).to_bytes(4, "little")
    fake = (1 << 10).to_bytes(4, "little")
    for at in _offsets(data, real):
        data[at : at + 4] = fake
    archive.write_bytes(bytes(data))
    failure = _refused(archive, tmp_path / "out", limit=1 << 20)
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert "CRC" in failure.message
    written = tmp_path / "out/zeros.bin"
    assert not written.exists() or written.stat().st_size <= 1 << 10


def _offsets(data: bytearray, value: bytes) -> list[int]:
    found, at = [], data.find(value)
    while at != -1:
        found.append(at)
        at = data.find(value, at + 1)
    assert found, "the size field was not found"
    return found


def test_tar_bomb_stops_at_the_budget(tmp_path: Path) -> None:
    """Members under the budget one by one but over it together stop at the one past it."""
    archive = _tar(
        tmp_path / "m.tar.gz", [(f"part-{i}", b"\0" * (300 << 10)) for i in range(8)], "w:gz"
    )
    failure = _refused(archive, tmp_path / "out", limit=1 << 20)
    assert failure.reason is Reason.MODEL_TOO_LARGE
    assert "part-3" in failure.message


def test_member_count_is_bounded(tmp_path: Path) -> None:
    """More members than --max-files is InvalidArchive, for tar and zip alike."""
    members = [(f"f{i}", b"x") for i in range(5)]
    tar_failure = _refused(_tar(tmp_path / "m.tar", list(members)), tmp_path / "t", max_members=4)
    zip_failure = _refused(_zip(tmp_path / "m.zip", list(members)), tmp_path / "z", max_members=4)
    for failure in (tar_failure, zip_failure):
        assert failure.reason is Reason.INVALID_ARCHIVE
        assert "more than 4 members" in failure.message


@pytest.mark.parametrize("name", ["m.tar", "m.tar.gz", "m.zip"])
def test_truncated_archive_is_invalid(tmp_path: Path, name: str) -> None:
    """An archive cut short (a download that stopped) is InvalidArchive."""
    payload = bytes(range(256)) * 400
    if name.endswith(".zip"):
        archive = _zip(tmp_path / name, [("a.bin", payload), ("b.bin", payload)])
    else:
        mode = "w" if name.endswith(".tar") else "w:gz"
        archive = _tar(tmp_path / name, [("a.bin", payload), ("b.bin", payload)], mode)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    failure = _refused(archive, tmp_path / "out")
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert "truncated or corrupt" in failure.message


def test_duplicate_member_is_refused(tmp_path: Path) -> None:
    """The same path twice is InvalidArchive: the second would silently replace the first."""
    archive = _tar(tmp_path / "m.tar", [("a", b"1"), ("./a", b"2")])
    failure = _refused(archive, tmp_path / "out")
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert "comes twice" in failure.message


def test_file_and_directory_of_one_name_is_refused(tmp_path: Path) -> None:
    """A path that is a file and also the directory of another file is InvalidArchive."""
    archive = _tar(tmp_path / "m.tar", [("a", b"1"), ("a/b", b"2")])
    failure = _refused(archive, tmp_path / "out")
    assert failure.reason is Reason.INVALID_ARCHIVE
