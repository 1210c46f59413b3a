"""OCI artifacts against a loopback registry laid out as routes: pull, verify, authenticate.

The routes are the Distribution API's two the fetch uses (`/v2/<repo>/manifests/<digest>`,
`/v2/<repo>/blobs/<digest>`) and a token realm; the manifests are built as `oras push`
writes them (a title annotation a layer, a directory as a gzip'd tar marked for unpacking).
The real-registry tests (CNCF Distribution) live with the e2e storage servers.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fleetserve_e2e.pki import ClusterPki

from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.reasons import Reason
from tests.runtime.storage.fetching import failed_fetch, run_fetch
from tests.runtime.storage.file_server import FileServer, Route

REPO = "models/enc"
CONFIG = b'{"hidden_size": 8}'
WEIGHTS = bytes(range(256)) * 64
TITLE = "org.opencontainers.image.title"
UNPACK = "io.deis.oras.content.unpack"


def _sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _tokenizer_dir() -> bytes:
    """A directory `tokenizer/` as `oras push` packs one: a gzip'd tar under its name."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        for name, data in (("tokenizer/vocab.txt", b"[PAD]\nhello\n"), ("tokenizer/merges", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return packed.getvalue()


def _layer(data: bytes, title: str | None, **annotations: str) -> dict[str, Any]:
    layer: dict[str, Any] = {
        "mediaType": "application/vnd.oci.image.layer.v1.tar",
        "digest": _sha(data),
        "size": len(data),
    }
    if title is not None:
        layer["annotations"] = {TITLE: title, **annotations}
    return layer


def _publish(
    server: FileServer, blobs: dict[str, bytes], layers: list[dict[str, Any]], **route: Any
) -> str:
    """Serve a manifest of `layers` and the `blobs`; the pinned URI of the manifest."""
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.empty.v1+json",
                "digest": _sha(b"{}"),
                "size": 2,
            },
            "layers": layers,
        }
    ).encode()
    digest = _sha(manifest)
    server.routes[f"/v2/{REPO}/manifests/{digest}"] = Route(body=manifest, **route)
    for name, data in blobs.items():
        server.routes[f"/v2/{REPO}/blobs/{name}"] = Route(body=data, **route)
    return f"oci://127.0.0.1:{server.port}/{REPO}:v1@{digest}"


def _model(server: FileServer, *, oras_py: bool = False, **route: Any) -> str:
    """The model as the oras CLI pushes it (directory annotated), or oras-py (typed only)."""
    tokenizer = _tokenizer_dir()
    blobs = {_sha(d): d for d in (CONFIG, WEIGHTS, tokenizer)}
    directory = _layer(tokenizer, "tokenizer", **({} if oras_py else {UNPACK: "true"}))
    if oras_py:
        directory["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
    layers = [_layer(CONFIG, "config.json"), _layer(WEIGHTS, "onnx/model.onnx"), directory]
    return _publish(server, blobs, layers, **route)


def _options(tmp_path: Path, pki: ClusterPki, **overrides: Any) -> FetchOptions:
    settings: dict[str, Any] = {"dest": tmp_path / "volume", "ca_file": pki.ca_cert}
    settings.update(overrides)
    return FetchOptions(**settings)


def _docker_config(tmp_path: Path, registry: str, user: str, password: str) -> Path:
    secret = tmp_path / "secret"
    secret.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (secret / ".dockerconfigjson").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    return secret


@pytest.mark.parametrize("oras_py", [False, True], ids=["oras-cli", "oras-py"])
def test_pulls_files_and_unpacks_directories(
    server: FileServer, pki: ClusterPki, tmp_path: Path, oras_py: bool
) -> None:
    """Layers land at their titles, a directory is unpacked; the digest is the manifest's."""
    uri = _model(server, oras_py=oras_py)
    options = _options(tmp_path, pki)
    fetched = run_fetch(uri, options)
    model = options.dest / "model"
    assert (model / "config.json").read_bytes() == CONFIG
    assert (model / "onnx/model.onnx").read_bytes() == WEIGHTS
    assert (model / "tokenizer/vocab.txt").read_bytes() == b"[PAD]\nhello\n"
    assert fetched.record.digest == uri.rsplit("@", 1)[1]
    assert [f.path for f in fetched.record.files] == [
        "config.json",
        "onnx/model.onnx",
        "tokenizer/merges",
        "tokenizer/vocab.txt",
    ]
    assert sorted(p.name for p in options.dest.iterdir()) == ["model", "model.json"]
    assert server.seen[0].headers["accept"].startswith("application/vnd.oci.image.manifest.v1+json")


def test_manifest_that_is_not_the_pinned_one(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A registry answering other bytes for the pinned digest: DigestMismatch."""
    uri = _model(server)
    pinned = uri.rsplit("@", 1)[1]
    server.routes[f"/v2/{REPO}/manifests/{pinned}"].body += b" "
    failure = failed_fetch(uri, _options(tmp_path, pki))
    assert failure.reason is Reason.DIGEST_MISMATCH
    assert "manifest" in failure.message


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda data: data[:-1] + b"!", id="other-bytes"),
        pytest.param(lambda data: data + b"more", id="longer"),
        pytest.param(lambda data: data[:-10], id="shorter"),
    ],
)
def test_blob_that_is_not_its_digest(
    server: FileServer, pki: ClusterPki, tmp_path: Path, tamper: Any
) -> None:
    """A blob with other bytes, or more or fewer than declared: DigestMismatch."""
    uri = _model(server)
    route = server.routes[f"/v2/{REPO}/blobs/{_sha(WEIGHTS)}"]
    route.body = tamper(route.body)
    failure = failed_fetch(uri, _options(tmp_path, pki))
    assert failure.reason is Reason.DIGEST_MISMATCH
    assert _sha(WEIGHTS) in failure.message


def test_missing_manifest(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """No such manifest: ModelNotFound."""
    uri = f"oci://127.0.0.1:{server.port}/{REPO}@sha256:{'c' * 64}"
    assert failed_fetch(uri, _options(tmp_path, pki)).reason is Reason.MODEL_NOT_FOUND


def test_declared_layers_over_budget(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """Layer sizes over --max-bytes fail ModelTooLarge before any blob is asked for."""
    uri = _model(server)
    failure = failed_fetch(uri, _options(tmp_path, pki, max_bytes=len(WEIGHTS)))
    assert failure.reason is Reason.MODEL_TOO_LARGE
    assert not any("/blobs/" in seen.path for seen in server.seen)


def test_server_error_fails_at_once(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """A 500 on a blob is StorageUnreachable on the first answer (no retry loop)."""
    uri = _model(server)
    server.routes[f"/v2/{REPO}/blobs/{_sha(WEIGHTS)}"].status = 500
    assert failed_fetch(uri, _options(tmp_path, pki)).reason is Reason.STORAGE_UNREACHABLE
    assert sum("/blobs/" in seen.path for seen in server.seen) == 2


def test_stalled_blob(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """A blob that stops arriving fails StorageUnreachable after the read timeout."""
    uri = _model(server)
    server.routes[f"/v2/{REPO}/blobs/{_sha(WEIGHTS)}"].stall_after = 100
    failure = failed_fetch(uri, _options(tmp_path, pki, read_timeout_s=0.5))
    assert failure.reason is Reason.STORAGE_UNREACHABLE


def test_basic_auth_from_a_docker_config(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A Basic challenge gets the .dockerconfigjson login; none or a wrong one is denied."""
    registry = f"127.0.0.1:{server.port}"
    login = "Basic " + base64.b64encode(b"robot:pa55word").decode()
    uri = _model(server, authorization=login, challenge='Basic realm="registry"')
    assert failed_fetch(uri, _options(tmp_path, pki)).reason is Reason.ACCESS_DENIED
    wrong = _docker_config(tmp_path / "wrong", registry, "robot", "guess")
    failure = failed_fetch(uri, _options(tmp_path, pki, credentials_dir=wrong))
    assert failure.reason is Reason.ACCESS_DENIED
    assert "guess" not in failure.message
    right = _docker_config(tmp_path, registry, "robot", "pa55word")
    run_fetch(uri, _options(tmp_path, pki, credentials_dir=right))
    assert (tmp_path / "volume/model/onnx/model.onnx").read_bytes() == WEIGHTS


def test_bearer_token_from_the_realm(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """A Bearer challenge: a token from the realm (asked with the login) on every request."""
    registry = f"127.0.0.1:{server.port}"
    realm = server.url("/token")
    challenge = f'Bearer realm="{realm}",service="registry",scope="repository:{REPO}:pull"'
    uri = _model(server, authorization="Bearer t0ken", challenge=challenge)
    login = "Basic " + base64.b64encode(b"robot:pa55word").decode()
    server.routes["/token"] = Route(body=b'{"token": "t0ken"}', authorization=login)
    secret = _docker_config(tmp_path, registry, "robot", "pa55word")
    run_fetch(uri, _options(tmp_path, pki, credentials_dir=secret))
    token_requests = [seen for seen in server.seen if seen.path.startswith("/token")]
    assert len(token_requests) == 1
    assert "scope=repository%3Amodels%2Fenc%3Apull" in token_requests[0].path
    blob_requests = [seen for seen in server.seen if "/blobs/" in seen.path]
    assert all(seen.headers.get("authorization") == "Bearer t0ken" for seen in blob_requests)


def test_image_index_is_refused(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """An index (several platforms) is not a model: InvalidArchive, name one manifest."""
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [],
        }
    ).encode()
    server.routes[f"/v2/{REPO}/manifests/{_sha(index)}"] = Route(body=index)
    uri = f"oci://127.0.0.1:{server.port}/{REPO}@{_sha(index)}"
    failure = failed_fetch(uri, _options(tmp_path, pki))
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert "index" in failure.message


@pytest.mark.parametrize(
    ("title", "says"),
    [pytest.param(None, "title", id="untitled"), pytest.param("../escape", "'..'", id="escaping")],
)
def test_layer_titles_must_name_a_path_inside(
    server: FileServer, pki: ClusterPki, tmp_path: Path, title: str | None, says: str
) -> None:
    """A layer without a title, or titled out of the model directory: InvalidArchive."""
    uri = _publish(server, {_sha(CONFIG): CONFIG}, [_layer(CONFIG, title)])
    failure = failed_fetch(uri, _options(tmp_path, pki))
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert says in failure.message
    assert not (tmp_path / "escape").exists()
