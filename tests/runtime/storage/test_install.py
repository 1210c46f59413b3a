"""The volume's install: all or nothing, found again when it matches, cleared when it does not."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fleetserve_runtime.storage import install
from fleetserve_runtime.storage.digests import Digest, FileEntry, tree_digest
from fleetserve_runtime.storage.install import InstallRecord, installed, prepare

URI = "s3://models/bert"


def _install(dest: Path, files: dict[str, bytes], *, uri: str = URI) -> InstallRecord:
    staging, _ = prepare(dest)
    entries = []
    for path, data in files.items():
        (staging / path).parent.mkdir(parents=True, exist_ok=True)
        (staging / path).write_bytes(data)
        entries.append(FileEntry(path, len(data), hashlib.sha256(data).hexdigest()))
    tree = tree_digest(entries)
    record = InstallRecord.of(uri, tree, tree, entries)
    install.commit(dest, staging, record)
    install.finish(dest)
    return record


def test_commit_leaves_the_model_and_its_record_only(tmp_path: Path) -> None:
    """After an install the volume holds model/ and model.json, nothing of the work."""
    record = _install(tmp_path, {"config.json": b"{}", "w/a.bin": b"abc"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.json"]
    assert InstallRecord.model_validate_json((tmp_path / "model.json").read_text()) == record
    assert record.bytes == 5
    assert (tmp_path / "model/w/a.bin").read_bytes() == b"abc"


def test_found_when_uri_pins_and_sizes_match(tmp_path: Path) -> None:
    """The install is found for its URI, its digest, and a limit it fits in."""
    record = _install(tmp_path, {"a.bin": b"abc"})
    digest = Digest.parse(record.digest)
    assert installed(tmp_path, uri=URI, pins=[digest], max_bytes=3) == record
    assert installed(tmp_path, uri=URI, pins=[], max_bytes=None) == record


def test_not_found_when_anything_differs(tmp_path: Path) -> None:
    """Another URI, another pin, a smaller limit, or a file changed in size: not reused."""
    _install(tmp_path, {"a.bin": b"abc", "b.bin": b"de"})
    assert installed(tmp_path, uri="s3://models/other", pins=[], max_bytes=None) is None
    assert installed(tmp_path, uri=URI, pins=[Digest("0" * 64)], max_bytes=None) is None
    assert installed(tmp_path, uri=URI, pins=[], max_bytes=4) is None
    (tmp_path / "model/b.bin").write_bytes(b"d")
    assert installed(tmp_path, uri=URI, pins=[], max_bytes=None) is None
    (tmp_path / "model/b.bin").unlink()
    assert installed(tmp_path, uri=URI, pins=[], max_bytes=None) is None


def test_not_found_without_a_readable_record(tmp_path: Path) -> None:
    """No record, or a record that is not one: nothing is installed."""
    assert installed(tmp_path, uri=URI, pins=[], max_bytes=None) is None
    _install(tmp_path, {"a.bin": b"abc"})
    (tmp_path / "model.json").write_text('{"uri": "s3://models/bert"}')
    assert installed(tmp_path, uri=URI, pins=[], max_bytes=None) is None


def test_a_record_without_its_model_is_not_an_install(tmp_path: Path) -> None:
    """A run cut between writing the record and renaming the model left no install."""
    _install(tmp_path, {"a.bin": b"abc"})
    (tmp_path / "model/a.bin").unlink()
    (tmp_path / "model").rmdir()
    assert installed(tmp_path, uri=URI, pins=[], max_bytes=None) is None


def test_prepare_clears_the_old_install_and_keeps_what_resumes(tmp_path: Path) -> None:
    """Record and model go (a model without record too), staging is empty, resume is kept."""
    _install(tmp_path, {"a.bin": b"abc"})
    staging, resume = prepare(tmp_path)
    (staging / "half-written").write_bytes(b"x")
    (resume / "partial").write_bytes(b"y")
    install.abandon(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model/orphan").write_bytes(b"z")
    staging, resume = prepare(tmp_path)
    assert not (tmp_path / "model").exists()
    assert not (tmp_path / "model.json").exists()
    assert list(staging.iterdir()) == []
    assert (resume / "partial").read_bytes() == b"y"


def test_abandon_keeps_no_model(tmp_path: Path) -> None:
    """A failed fetch leaves nothing at model/ and no record; only the resume area stays."""
    staging, resume = prepare(tmp_path)
    (staging / "a.bin").write_bytes(b"abc")
    install.abandon(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fetch"]
    assert [p.name for p in (tmp_path / ".fetch").iterdir()] == ["resume"]
