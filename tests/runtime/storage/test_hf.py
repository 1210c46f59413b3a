"""Hugging Face repositories: offline from a pre-populated cache, online from a loopback Hub.

The cache is built here in huggingface_hub's own layout (blobs, refs, snapshots of links)
from tiny files; offline fetches name an endpoint nothing listens on, so any network use
would fail them. The online cases point the endpoint at the loopback HTTPS server, laid out
with the three Hub routes a snapshot download uses (the revision, the file tree, each file).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from fleetserve_e2e.pki import ClusterPki

from fleetserve_runtime.storage.digests import Digest, FileEntry, tree_digest
from fleetserve_runtime.storage.options import FetchOptions, HfSettings
from fleetserve_runtime.storage.reasons import Reason
from tests.runtime.storage.fetching import failed_fetch, run_fetch
from tests.runtime.storage.file_server import FileServer, Route

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": b'{"hidden_size": 8}', "onnx/model.onnx": b"\x08\x01" * 100}
NOWHERE = "https://127.0.0.1:9"
"""An endpoint nothing listens on: an offline fetch that touched the network would fail."""


def _cache(root: Path, repo: str = "org/tiny", files: dict[str, bytes] = FILES) -> Path:
    """A huggingface_hub cache holding `repo` at COMMIT, with the ref `main` to it."""
    storage = root / f"models--{repo.replace('/', '--')}"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs/main").write_text(COMMIT)
    for path, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = storage / "snapshots" / COMMIT / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return root


def _offline(tmp_path: Path, cache: Path, **overrides: object) -> FetchOptions:
    settings: dict[str, object] = {
        "dest": tmp_path / "volume",
        "hf": HfSettings(endpoint=NOWHERE, cache_dir=cache, offline=True),
    }
    settings.update(overrides)
    return FetchOptions(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("revision", ["main", COMMIT])
def test_offline_from_a_prepopulated_cache(tmp_path: Path, revision: str) -> None:
    """The snapshot's files are copied (not linked) into model/; the digest is the tree's."""
    cache = _cache(tmp_path / "cache")
    options = _offline(tmp_path, cache)
    fetched = run_fetch(f"hf://org/tiny@{revision}", options)
    for path, data in FILES.items():
        installed = options.dest / "model" / path
        assert installed.read_bytes() == data
        assert not installed.is_symlink()
    entries = [FileEntry(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in FILES.items()]
    assert fetched.record.digest == str(tree_digest(entries))
    assert fetched.record.tree_digest == fetched.record.digest
    assert fetched.record.uri == f"hf://org/tiny@{revision}"
    assert (cache / "models--org--tiny/snapshots" / COMMIT / "config.json").is_symlink()


def test_offline_digest_pin(tmp_path: Path) -> None:
    """--digest pins the tree: the right one passes, another fails DigestMismatch."""
    cache = _cache(tmp_path / "cache")
    first = run_fetch("hf://org/tiny@main", _offline(tmp_path, cache))
    pinned = Digest.parse(first.record.digest)
    assert run_fetch("hf://org/tiny@main", _offline(tmp_path, cache, digest=pinned)).reused
    failure = failed_fetch(
        "hf://org/tiny@main",
        _offline(tmp_path, cache, dest=tmp_path / "v2", digest=Digest("1" * 64)),
    )
    assert failure.reason is Reason.DIGEST_MISMATCH


def test_offline_cache_miss_is_model_not_found(tmp_path: Path) -> None:
    """A revision or repository not in the cache: ModelNotFound, without any network."""
    cache = _cache(tmp_path / "cache")
    for uri in ("hf://org/tiny@v2", "hf://org/other@main"):
        failure = failed_fetch(uri, _offline(tmp_path, cache))
        assert failure.reason is Reason.MODEL_NOT_FOUND
        assert "offline" in failure.message


def test_offline_over_budget(tmp_path: Path) -> None:
    """The snapshot's sizes are checked against --max-bytes before anything is copied."""
    cache = _cache(tmp_path / "cache")
    failure = failed_fetch("hf://org/tiny@main", _offline(tmp_path, cache, max_bytes=100))
    assert failure.reason is Reason.MODEL_TOO_LARGE


def test_a_cache_link_out_of_the_cache_is_refused(tmp_path: Path) -> None:
    """A snapshot entry that leads out of the cache is not followed: InvalidArchive."""
    cache = _cache(tmp_path / "cache")
    outside = tmp_path / "outside-secret"
    outside.write_text("not a model file")
    (cache / "models--org--tiny/snapshots" / COMMIT / "leak").symlink_to(outside)
    failure = failed_fetch("hf://org/tiny@main", _offline(tmp_path, cache))
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert "leak" in failure.message


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        pytest.param(None, Reason.MODEL_NOT_FOUND, id="404"),
        pytest.param(Route(status=403), Reason.ACCESS_DENIED, id="403"),
        pytest.param(Route(status=500), Reason.STORAGE_UNREACHABLE, id="500"),
    ],
)
def test_online_errors_are_mapped(
    server: FileServer, pki: ClusterPki, tmp_path: Path, route: Route | None, reason: Reason
) -> None:
    """The Hub's answers to the repository lookup become the named reasons."""
    if route is not None:
        server.routes["/api/models/org/tiny/revision/main"] = route
    options = FetchOptions(
        dest=tmp_path / "volume",
        ca_file=pki.ca_cert,
        hf=HfSettings(endpoint=server.url("").rstrip("/"), cache_dir=tmp_path / "cache"),
    )
    failure = failed_fetch("hf://org/tiny@main", options)
    assert failure.reason is reason
    assert server.seen, "the Hub was not asked"


def test_unreachable_hub(tmp_path: Path) -> None:
    """A Hub nothing answers at, with nothing cached: StorageUnreachable."""
    options = FetchOptions(
        dest=tmp_path / "volume",
        hf=HfSettings(endpoint=NOWHERE, cache_dir=tmp_path / "cache"),
    )
    assert failed_fetch("hf://org/tiny@main", options).reason is Reason.STORAGE_UNREACHABLE


def test_plain_http_hub_only_when_allowed(tmp_path: Path) -> None:
    """An http:// endpoint is refused (InvalidUri) unless --allow-http."""
    cache = _cache(tmp_path / "cache")
    plain = HfSettings(endpoint="http://127.0.0.1:9", cache_dir=cache, offline=True)
    failure = failed_fetch("hf://org/tiny@main", _offline(tmp_path, cache, hf=plain))
    assert failure.reason is Reason.INVALID_URI
    assert "--allow-http" in failure.message
    assert not run_fetch(
        "hf://org/tiny@main", _offline(tmp_path, cache, hf=plain, allow_http=True)
    ).reused


def _hub(server: FileServer, files: dict[str, bytes] = FILES) -> None:
    """The Hub's routes for `org/tiny` at `main` = COMMIT, holding `files`."""
    info = {"id": "org/tiny", "sha": COMMIT, "siblings": [{"rfilename": p} for p in files]}
    tree = [
        {"type": "file", "oid": hashlib.sha1(d).hexdigest(), "size": len(d), "path": p}
        for p, d in files.items()
    ]
    json_type = {"Content-Type": "application/json"}
    server.routes["/api/models/org/tiny/revision/main"] = Route(
        body=json.dumps(info).encode(), headers=json_type
    )
    server.routes[f"/api/models/org/tiny/tree/{COMMIT}"] = Route(
        body=json.dumps(tree).encode(), headers=json_type
    )
    for path, data in files.items():
        server.routes[f"/org/tiny/resolve/{COMMIT}/{path}"] = Route(
            body=data, etag=f'"{hashlib.sha1(data).hexdigest()}"', headers={"X-Repo-Commit": COMMIT}
        )


def _online(
    server: FileServer, pki: ClusterPki, tmp_path: Path, **overrides: object
) -> FetchOptions:
    settings: dict[str, object] = {
        "dest": tmp_path / "volume",
        "ca_file": pki.ca_cert,
        "hf": HfSettings(endpoint=server.url("").rstrip("/")),
    }
    settings.update(overrides)
    return FetchOptions(**settings)  # type: ignore[arg-type]


def test_online_download_with_the_token(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """Downloaded through a scratch cache in the volume, the token sent; only the model stays."""
    _hub(server)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "token").write_text("hf_fetchtesttoken")
    options = _online(server, pki, tmp_path, credentials_dir=secret)
    fetched = run_fetch("hf://org/tiny@main", options)
    for path, data in FILES.items():
        assert (options.dest / "model" / path).read_bytes() == data
    assert fetched.record.bytes == sum(len(d) for d in FILES.values())
    assert sorted(p.name for p in options.dest.iterdir()) == ["model", "model.json"]
    assert all(
        seen.headers.get("authorization") == "Bearer hf_fetchtesttoken" for seen in server.seen
    )


def test_online_sizes_over_budget(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """The repository's declared sizes over --max-bytes: ModelTooLarge before any file body."""
    _hub(server)
    failure = failed_fetch("hf://org/tiny@main", _online(server, pki, tmp_path, max_bytes=100))
    assert failure.reason is Reason.MODEL_TOO_LARGE
    assert not [seen for seen in server.seen if seen.method == "GET" and "/resolve/" in seen.path]


def test_a_redirect_to_plain_http_is_refused(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A Hub whose file download redirects to http (a CDN, say) is refused unless allowed."""
    _hub(server)
    data = FILES["config.json"]
    server.routes[f"/org/tiny/resolve/{COMMIT}/config.json"] = Route(
        redirect="http://127.0.0.1:9/config.json",
        etag=f'"{hashlib.sha1(data).hexdigest()}"',
        headers={"X-Repo-Commit": COMMIT, "X-Linked-Size": str(len(data))},
    )
    failure = failed_fetch("hf://org/tiny@main", _online(server, pki, tmp_path))
    assert failure.reason is Reason.STORAGE_UNREACHABLE
    assert "plain http" in failure.message
