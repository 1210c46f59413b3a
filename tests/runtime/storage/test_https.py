"""HTTPS fetches end to end against a loopback TLS server: success, every failure, resume.

Each fetch goes through `fetch` (the command's own path): parse, stage, download, verify,
install. After a failure the volume holds no `model/` and no record.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from fleetserve_e2e.pki import ClusterPki

from fleetserve_runtime.storage.digests import Digest
from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.reasons import Reason
from tests.runtime.storage.fetching import failed_fetch, run_fetch
from tests.runtime.storage.file_server import FileServer, Route

BODY = bytes(range(256)) * 4096
"""1 MiB of model."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _uri(server: FileServer, path: str, data: bytes) -> str:
    return f"{server.url(path)}#sha256={_sha(data)}"


def _options(tmp_path: Path, pki: ClusterPki, **overrides: object) -> FetchOptions:
    settings: dict[str, object] = {"dest": tmp_path / "volume", "ca_file": pki.ca_cert}
    settings.update(overrides)
    return FetchOptions(**settings)  # type: ignore[arg-type]


def test_single_file(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """The file lands in model/ by its URL's name, with its record, progress and digest."""
    server.routes["/m/model.onnx"] = Route(body=BODY)
    events: list[dict[str, object]] = []
    options = _options(tmp_path, pki)
    fetched = run_fetch(_uri(server, "/m/model.onnx", BODY), options, events)
    assert (options.dest / "model/model.onnx").read_bytes() == BODY
    assert fetched.record.digest == f"sha256:{_sha(BODY)}"
    assert fetched.record.bytes == len(BODY)
    assert not fetched.reused
    record = json.loads((options.dest / "model.json").read_text())
    assert record["files"] == [{"path": "model.onnx", "size": len(BODY), "sha256": _sha(BODY)}]
    assert events[0] == {"event": "progress", "bytes_done": 0, "bytes_total": len(BODY)}
    assert events[-1] == {"event": "progress", "bytes_done": len(BODY), "bytes_total": len(BODY)}
    assert sorted(p.name for p in options.dest.iterdir()) == ["model", "model.json"]


def test_archive_is_unpacked(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """A .tar.gz is unpacked into model/; the digest is the archive's, the tree's recorded."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name, data in (("config.json", b"{}"), ("weights/w.bin", BODY)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    server.routes["/model.tar.gz"] = Route(body=archive.getvalue())
    options = _options(tmp_path, pki)
    fetched = run_fetch(_uri(server, "/model.tar.gz", archive.getvalue()), options)
    assert (options.dest / "model/weights/w.bin").read_bytes() == BODY
    assert not (options.dest / "model/model.tar.gz").exists()
    assert fetched.record.digest == f"sha256:{_sha(archive.getvalue())}"
    assert [f.path for f in fetched.record.files] == ["config.json", "weights/w.bin"]
    assert fetched.record.tree_digest != fetched.record.digest


def test_hostile_archive_installs_nothing(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """An archive with a path out of the model fails InvalidArchive, and is not kept."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("../../escape")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    server.routes["/m.tar"] = Route(body=archive.getvalue())
    options = _options(tmp_path, pki)
    assert (
        failed_fetch(_uri(server, "/m.tar", archive.getvalue()), options).reason
        is Reason.INVALID_ARCHIVE
    )
    assert not (tmp_path / "escape").exists()
    assert not any((options.dest / ".fetch/resume").iterdir())


def test_sha_mismatch(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """Bytes that are not the pinned ones: DigestMismatch, and the download is dropped."""
    server.routes["/model.onnx"] = Route(body=BODY)
    options = _options(tmp_path, pki)
    failure = failed_fetch(f"{server.url('/model.onnx')}#sha256={'0' * 64}", options)
    assert failure.reason is Reason.DIGEST_MISMATCH
    assert _sha(BODY) in failure.message
    assert not any((options.dest / ".fetch/resume").iterdir())


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        pytest.param(None, Reason.MODEL_NOT_FOUND, id="404"),
        pytest.param(Route(status=500), Reason.STORAGE_UNREACHABLE, id="500"),
        pytest.param(Route(status=503), Reason.STORAGE_UNREACHABLE, id="503"),
        pytest.param(Route(status=403), Reason.ACCESS_DENIED, id="403"),
        pytest.param(
            Route(body=BODY, authorization="Bearer s3cret-token"), Reason.ACCESS_DENIED, id="401"
        ),
    ],
)
def test_status_failures(
    server: FileServer, pki: ClusterPki, tmp_path: Path, route: Route | None, reason: Reason
) -> None:
    """Each failing status is its reason, with the status in the message."""
    if route is not None:
        server.routes["/model.onnx"] = route
    failure = failed_fetch(_uri(server, "/model.onnx", BODY), _options(tmp_path, pki))
    assert failure.reason is reason


def test_bearer_token_from_the_credentials_dir(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """The credentials directory's token is sent; it never shows in a message."""
    server.routes["/model.onnx"] = Route(body=BODY, authorization="Bearer s3cret-token")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "token").write_text("s3cret-token\n")
    run_fetch(_uri(server, "/model.onnx", BODY), _options(tmp_path, pki, credentials_dir=secret))
    assert server.seen[-1].headers["authorization"] == "Bearer s3cret-token"
    (secret / "token").write_text("wrong-token-value")
    failure = failed_fetch(
        _uri(server, "/model.onnx", BODY),
        _options(tmp_path, pki, credentials_dir=secret, dest=tmp_path / "v2"),
    )
    assert failure.reason is Reason.ACCESS_DENIED
    assert "wrong-token-value" not in failure.message


def test_stall_mid_body(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """A server that stops sending mid-body fails StorageUnreachable after the read timeout."""
    server.routes["/model.onnx"] = Route(body=BODY, stall_after=1000)
    options = _options(tmp_path, pki, read_timeout_s=0.5)
    failure = failed_fetch(_uri(server, "/model.onnx", BODY), options)
    assert failure.reason is Reason.STORAGE_UNREACHABLE
    assert "timeout" in failure.message


def test_resume_after_an_interrupted_download(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A cut download resumes where it stopped: Range and If-Range, and a 206 for the rest."""
    half = len(BODY) // 2
    server.routes["/model.onnx"] = Route(body=BODY, cut_after=half)
    options = _options(tmp_path, pki)
    uri = _uri(server, "/model.onnx", BODY)
    assert failed_fetch(uri, options).reason is Reason.STORAGE_UNREACHABLE
    assert (options.dest / ".fetch/resume" / _sha(BODY)).stat().st_size == half
    server.routes["/model.onnx"].cut_after = None
    run_fetch(uri, options)
    resumed = server.seen[-1].headers
    assert resumed["range"] == f"bytes={half}-"
    assert resumed["if-range"] == '"v1"'
    assert (options.dest / "model/model.onnx").read_bytes() == BODY
    assert not (options.dest / ".fetch").exists()


def test_a_whole_download_left_behind_is_not_fetched_again(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A run that downloaded the whole file and then failed leaves it; the next asks nothing."""
    options = _options(tmp_path, pki)
    resume = options.dest / ".fetch/resume"
    resume.mkdir(parents=True)
    (resume / _sha(BODY)).write_bytes(BODY)
    run_fetch(_uri(server, "/model.onnx", BODY), options)
    assert (options.dest / "model/model.onnx").read_bytes() == BODY
    assert server.seen == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"etag": '"v2"'}, id="file-changed"),
        pytest.param({"ranges": False}, id="no-ranges"),
    ],
)
def test_resume_starts_over_when_the_server_sends_all(
    server: FileServer, pki: ClusterPki, tmp_path: Path, change: dict[str, object]
) -> None:
    """When the validator no longer matches, or ranges are not served, the 200 starts over."""
    server.routes["/model.onnx"] = Route(body=BODY, cut_after=len(BODY) // 3)
    options = _options(tmp_path, pki)
    uri = _uri(server, "/model.onnx", BODY)
    failed_fetch(uri, options)
    route = server.routes["/model.onnx"]
    route.cut_after = None
    for name, value in change.items():
        setattr(route, name, value)
    run_fetch(uri, options)
    assert (options.dest / "model/model.onnx").read_bytes() == BODY


def test_content_length_over_budget(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """A Content-Length over --max-bytes fails ModelTooLarge before the body is read."""
    server.routes["/model.onnx"] = Route(body=BODY)
    options = _options(tmp_path, pki, max_bytes=len(BODY) - 1)
    failure = failed_fetch(_uri(server, "/model.onnx", BODY), options)
    assert failure.reason is Reason.MODEL_TOO_LARGE
    assert str(len(BODY)) in failure.message
    assert not (options.dest / ".fetch/resume" / _sha(BODY)).exists()


def test_streamed_body_over_budget(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """A body without Content-Length stops at --max-bytes with ModelTooLarge."""
    server.routes["/model.onnx"] = Route(body=BODY, send_length=False)
    options = _options(tmp_path, pki, max_bytes=len(BODY) // 4)
    failure = failed_fetch(_uri(server, "/model.onnx", BODY), options)
    assert failure.reason is Reason.MODEL_TOO_LARGE
    partial = options.dest / ".fetch/resume" / _sha(BODY)
    assert partial.stat().st_size <= len(BODY) // 4 + (1 << 20)


def test_rerun_reuses_an_intact_install_only(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """An init container that runs again fetches nothing; a damaged install is fetched again."""
    server.routes["/model.onnx"] = Route(body=BODY)
    options = _options(tmp_path, pki)
    uri = _uri(server, "/model.onnx", BODY)
    run_fetch(uri, options)
    again = run_fetch(uri, options)
    assert again.reused
    assert again.record.digest == f"sha256:{_sha(BODY)}"
    assert len(server.seen) == 1
    (options.dest / "model/model.onnx").write_bytes(b"truncated")
    assert not run_fetch(uri, options).reused
    assert (options.dest / "model/model.onnx").read_bytes() == BODY
    assert len(server.seen) == 2


def test_another_uri_replaces_the_install(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A new URI for the volume replaces the old model entirely."""
    server.routes["/a.bin"] = Route(body=b"first")
    server.routes["/b.bin"] = Route(body=b"second")
    options = _options(tmp_path, pki)
    run_fetch(_uri(server, "/a.bin", b"first"), options)
    run_fetch(_uri(server, "/b.bin", b"second"), options)
    assert [p.name for p in (options.dest / "model").iterdir()] == ["b.bin"]


def test_digest_flag_must_agree_with_the_uri(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """--digest that differs from the URI's sha256 fails before any request."""
    options = _options(tmp_path, pki, digest=Digest("1" * 64))
    failure = failed_fetch(_uri(server, "/model.onnx", BODY), options)
    assert failure.reason is Reason.DIGEST_MISMATCH
    assert server.seen == []


def test_digest_flag_pins_a_plain_url(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """The operator's form: the URL alone, its SHA-256 in --digest; a wrong one fails."""
    server.routes["/model.onnx"] = Route(body=BODY)
    fetched = run_fetch(
        server.url("/model.onnx"), _options(tmp_path, pki, digest=Digest(_sha(BODY)))
    )
    assert fetched.record.digest == f"sha256:{_sha(BODY)}"
    assert fetched.record.uri == server.url("/model.onnx")
    failure = failed_fetch(
        server.url("/model.onnx"),
        _options(tmp_path, pki, dest=tmp_path / "v2", digest=Digest("2" * 64)),
    )
    assert failure.reason is Reason.DIGEST_MISMATCH
    no_pin = failed_fetch(server.url("/model.onnx"), _options(tmp_path, pki, dest=tmp_path / "v3"))
    assert no_pin.reason is Reason.INVALID_URI


def test_redirect_to_plain_http_is_refused(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A redirect from https to http is refused unless --allow-http."""
    server.routes["/model.onnx"] = Route(redirect="http://127.0.0.1:9/model.onnx")
    failure = failed_fetch(_uri(server, "/model.onnx", BODY), _options(tmp_path, pki))
    assert failure.reason is Reason.STORAGE_UNREACHABLE
    assert "plain http" in failure.message


def test_untrusted_certificate(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """Without the CA that signed the server's certificate, TLS fails: StorageUnreachable."""
    server.routes["/model.onnx"] = Route(body=BODY)
    failure = failed_fetch(_uri(server, "/model.onnx", BODY), _options(tmp_path, pki, ca_file=None))
    assert failure.reason is Reason.STORAGE_UNREACHABLE
    assert "CERTIFICATE_VERIFY_FAILED" in failure.message
