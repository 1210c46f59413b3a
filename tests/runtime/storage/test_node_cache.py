"""The node cache: a pinned model restored byte-checked, published whole, never trusted blindly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fleetserve_e2e.pki import ClusterPki

from fleetserve_runtime.storage.digests import Digest, FileEntry, tree_digest
from fleetserve_runtime.storage.install import InstallRecord
from fleetserve_runtime.storage.node_cache import CacheOutcome, entry_name, publish, restore
from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.reasons import Reason
from tests.runtime.storage.fetching import failed_fetch, run_fetch
from tests.runtime.storage.file_server import FileServer, Route

FILES = {"config.json": b'{"hidden_size": 8}', "onnx/model.onnx": b"\x08\x01" * 5000}


def _install(dest: Path, files: dict[str, bytes] = FILES) -> InstallRecord:
    """An install in `dest` as a fetch leaves it (s3-like: the digest is the tree's)."""
    entries = []
    for path, data in files.items():
        (dest / "model" / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / "model" / path).write_bytes(data)
        entries.append(FileEntry(path, len(data), hashlib.sha256(data).hexdigest()))
    tree = tree_digest(entries)
    record = InstallRecord.of("s3://b/p", tree, tree, entries)
    (dest / "model.json").write_text(record.model_dump_json())
    return record


def _staged(staging: Path) -> dict[str, bytes]:
    return {
        p.relative_to(staging).as_posix(): p.read_bytes()
        for p in sorted(staging.rglob("*"))
        if p.is_file()
    }


def _published(tmp_path: Path) -> tuple[Path, InstallRecord]:
    cache = tmp_path / "cache"
    cache.mkdir()
    record = _install(tmp_path / "volume")
    assert publish(cache, tmp_path / "volume", record) is CacheOutcome.STORED
    return cache, record


def test_a_published_install_is_restored_with_its_record(tmp_path: Path) -> None:
    cache, record = _published(tmp_path)
    staging = tmp_path / "staging"
    staging.mkdir()
    assert restore(cache, Digest.parse(record.digest), staging) == record
    assert _staged(staging) == FILES
    assert [p.name for p in cache.iterdir()] == [entry_name(Digest.parse(record.digest))]


def test_a_second_publisher_finds_the_entry_there(tmp_path: Path) -> None:
    cache, record = _published(tmp_path)
    assert publish(cache, tmp_path / "volume", record) is CacheOutcome.PRESENT
    assert len(list(cache.iterdir())) == 1


def test_a_cache_that_cannot_be_written_is_reported_not_raised(tmp_path: Path) -> None:
    """A path that is a file stands for any unwritable cache (the tests run as root)."""
    record = _install(tmp_path / "volume")
    (tmp_path / "not-a-dir").write_text("")
    assert publish(tmp_path / "not-a-dir", tmp_path / "volume", record) is CacheOutcome.UNWRITABLE


def test_a_miss_leaves_staging_empty(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    assert restore(tmp_path, Digest("0" * 64), staging) is None
    assert list(staging.iterdir()) == []


def _tamper(entry: Path, how: str) -> None:
    model, record = entry / "model", json.loads((entry / "model.json").read_text())
    if how == "bytes":
        data = (model / "onnx/model.onnx").read_bytes()
        (model / "onnx/model.onnx").write_bytes(b"\x09" + data[1:])
    elif how == "missing":
        (model / "config.json").unlink()
    elif how == "symlink":
        (model / "config.json").unlink()
        (model / "config.json").symlink_to("/etc/hostname")
    elif how == "escape":
        record["files"][0]["path"] = "../../outside.json"
        (entry / "model.json").write_text(json.dumps(record))
    elif how == "other-digest":
        record["digest"] = "sha256:" + "f" * 64
        (entry / "model.json").write_text(json.dumps(record))
    elif how == "record":
        (entry / "model.json").write_text("{")


@pytest.mark.parametrize("how", ["bytes", "missing", "symlink", "escape", "other-digest", "record"])
def test_a_bad_entry_is_passed_over(tmp_path: Path, how: str) -> None:
    """Any difference from the record, or a record that does not hold, is a miss.

    Nothing is staged, and the entry is removed so that the next fetch publishes a good one.
    """
    cache, record = _published(tmp_path)
    digest = Digest.parse(record.digest)
    _tamper(cache / entry_name(digest), how)
    staging = tmp_path / "staging"
    staging.mkdir()
    assert restore(cache, digest, staging) is None
    assert list(staging.iterdir()) == []
    assert not (tmp_path / "outside.json").exists()
    if how != "record":
        assert not (cache / entry_name(digest)).exists()


BODY = b"weights" * 1000
SHA = hashlib.sha256(BODY).hexdigest()


def _options(dest: Path, cache: Path, pki: ClusterPki) -> FetchOptions:
    return FetchOptions(dest=dest, cache_dir=cache, ca_file=pki.ca_cert)


def test_the_second_pod_on_a_node_does_not_ask_the_store(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """First fetch: from the store, then published. Second, into another volume: a hit.

    The store gets no request, and the install is the same as the first.
    """
    server.routes["/model.onnx"] = Route(body=BODY)
    uri = f"{server.url('/model.onnx')}#sha256={SHA}"
    cache = tmp_path / "cache"
    cache.mkdir()
    first = run_fetch(uri, _options(tmp_path / "a", cache, pki))
    assert first.cache is CacheOutcome.STORED
    asked = len(server.seen)
    second = run_fetch(uri, _options(tmp_path / "b", cache, pki))
    assert second.cache is CacheOutcome.HIT
    assert len(server.seen) == asked
    assert second.record == first.record
    assert (tmp_path / "b/model/model.onnx").read_bytes() == BODY
    assert not (tmp_path / "b/.fetch").exists()


def test_a_cache_needs_a_pinned_digest(tmp_path: Path) -> None:
    options = FetchOptions(dest=tmp_path / "v", cache_dir=tmp_path)
    failure = failed_fetch("s3://bucket/prefix", options)
    assert failure.reason is Reason.INVALID_URI
    assert "--cache-dir needs a pinned digest" in failure.message
