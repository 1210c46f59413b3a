"""`fleetserve-runtime fetch`, the init container's command, against the real storage servers.

Each fetch runs as the init container runs it, a process with flags, and is judged by what
the pod would show: its exit status, its JSON lines, its termination message, and the volume
(`model/` and `model.json`, or nothing). The stores: SeaweedFS's S3 (read-only key, path
addressing, its own CA), Distribution (htpasswd, a `.dockerconfigjson` as a pull Secret
mounts it, an artifact pushed with oras-py), the HTTPS file server (ranges, injected faults).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import oras.client
import pytest

from fleetserve_e2e.file_server import Fault, HttpsFileServer
from fleetserve_e2e.object_store import ObjectStore, S3Credentials, tree_digest
from fleetserve_e2e.oci_registry import OciRegistry

WRONG = "not-the-secret"
"""The wrong secret or password the refused logins use (never to appear in a report)."""
FILES = {
    "config.json": b'{"hidden_size": 8}',
    "onnx/model.onnx": bytes(range(256)) * 2048,
    "tokenizer.json": b'{"model": {"vocab": {}}}',
}


@dataclass(frozen=True)
class Run:
    """One fetch process: its exit status, stdout events, and termination message."""

    status: int
    events: list[dict[str, object]]
    report: dict[str, str] | None
    dest: Path

    def installed(self) -> dict[str, bytes]:
        """The installed files by path (empty when nothing is installed)."""
        model = self.dest / "model"
        return {
            p.relative_to(model).as_posix(): p.read_bytes()
            for p in sorted(model.rglob("*"))
            if p.is_file()
        }


def _fetch(dest: Path, *args: str | Path) -> Run:
    log = dest.parent / f"{dest.name}.termination-log"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "fleetserve_runtime", "fetch", "--dest", str(dest),
         "--termination-log", str(log), *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines()]
    report = json.loads(log.read_text()) if log.exists() else None
    return Run(done.returncode, events, report, dest)


def _failed(run: Run, reason: str) -> None:
    assert run.status == 1, run.events
    assert run.report is not None
    assert run.report["reason"] == reason, run.report
    assert not (run.dest / "model").exists()
    assert not (run.dest / "model.json").exists()


def _cases(table: str) -> dict[str, str]:
    """`case: reason` lines, by case."""
    return dict(line.split(": ") for line in table.strip().splitlines())


def _write(directory: Path, files: dict[str, bytes]) -> Path:
    for path, data in files.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(data)
    return directory


# S3 (SeaweedFS)


def _s3_keys(directory: Path, keys: S3Credentials, *, secret: str | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "accessKeyId").write_text(keys.access_key)
    (directory / "secretAccessKey").write_text(secret or keys.secret_key)
    return directory


def _s3_flags(store: ObjectStore) -> list[str | Path]:
    return ["--s3-endpoint", store.endpoint_url, "--s3-region", store.region,
            "--s3-addressing", "path", "--ca-file", store.ca_cert]  # fmt: skip


@pytest.fixture
def s3_model(object_store: ObjectStore, tmp_path: Path) -> str:
    """FILES uploaded under a fresh prefix; its s3:// URI."""
    prefix = f"fetch/{uuid.uuid4().hex[:8]}"
    object_store.upload_directory(_write(tmp_path / "upload", FILES), prefix)
    return f"s3://{object_store.bucket}/{prefix}"


def test_s3_prefix_with_a_read_only_key(
    object_store: ObjectStore, s3_model: str, tmp_path: Path
) -> None:
    """Every object under the prefix, pinned by its tree digest; a re-run reuses it."""
    keys = _s3_keys(tmp_path / "keys", object_store.read_only)
    digest = tree_digest(FILES)
    args = ["--uri", s3_model, "--credentials-dir", keys, "--digest", digest,
            *_s3_flags(object_store)]  # fmt: skip
    run = _fetch(tmp_path / "volume", *args)
    assert run.status == 0, run.report
    assert run.installed() == FILES
    assert run.events[-1] == {"event": "fetched", "digest": digest,
                              "bytes": sum(map(len, FILES.values())), "files": 3,
                              "reused": False}  # fmt: skip
    again = _fetch(tmp_path / "volume", *args)
    assert again.events == [{**run.events[-1], "reused": True}]


def _s3_failure(request: pytest.FixtureRequest, case: str, tmp_path: Path) -> list[str | Path]:
    """The flags of an S3 fetch that fails as `case` says."""
    object_store: ObjectStore = request.getfixturevalue("object_store")
    s3_model: str = request.getfixturevalue("s3_model")
    # The read-only key is limited to its bucket: a bucket beyond it is refused, not missing.
    identity = object_store.admin if case == "missing-bucket" else object_store.read_only
    secret = WRONG if case == "wrong-secret" else None
    keys = _s3_keys(tmp_path / "keys", identity, secret=secret)
    uri = {
        "missing-prefix": f"{s3_model}-gone",
        "missing-bucket": "s3://no-such-bucket/x",
        "other-bucket": "s3://no-such-bucket/x",
    }
    extra = {
        "over-budget": ["--max-bytes", "1000"],
        "other-digest": ["--digest", "sha256:" + "0" * 64],
    }
    args = ["--uri", uri.get(case, s3_model), *_s3_flags(object_store), *extra.get(case, [])]
    if case != "anonymous":
        args += ["--credentials-dir", keys]
    return args


# OCI (Distribution)


@pytest.fixture
def oci_model(oci_registry: OciRegistry, tmp_path: Path) -> str:
    """FILES pushed with oras-py (two files and a directory); the pinned oci:// URI."""
    artifact = _write(tmp_path / "artifact", FILES)
    config = oci_registry.write_docker_config(tmp_path / "docker" / "config.json")
    tagged = oci_registry.reference(f"models/fetch-{uuid.uuid4().hex[:8]}", "v1")
    client = oras.client.OrasClient(tls_verify=str(oci_registry.ca_cert), auth_backend="basic")
    pushed = client.push(
        target=tagged,
        files=[
            str(artifact / "config.json"),
            str(artifact / "tokenizer.json"),
            str(artifact / "onnx"),
        ],
        config_path=str(config),
        disable_path_validation=True,
    )
    return f"oci://{tagged}@{pushed.headers['Docker-Content-Digest']}"


def _pull_secret(registry: OciRegistry, directory: Path, *, password: str | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / ".dockerconfigjson").write_text(
        json.dumps(registry.docker_config(password=password))
    )
    return directory


def test_oci_artifact_with_a_pull_secret(
    oci_registry: OciRegistry, oci_model: str, tmp_path: Path
) -> None:
    """The artifact lands file by file (the directory unpacked); its digest is the manifest's."""
    secret = _pull_secret(oci_registry, tmp_path / "secret")
    run = _fetch(tmp_path / "volume", "--uri", oci_model, "--credentials-dir", secret,
                 "--ca-file", oci_registry.ca_cert)  # fmt: skip
    assert run.status == 0, run.report
    assert run.installed() == FILES
    assert run.events[-1]["digest"] == oci_model.rsplit("@", 1)[1]


def _oci_failure(request: pytest.FixtureRequest, case: str, tmp_path: Path) -> list[str | Path]:
    """The flags of an OCI fetch that fails as `case` says."""
    oci_registry: OciRegistry = request.getfixturevalue("oci_registry")
    oci_model: str = request.getfixturevalue("oci_model")
    password = WRONG if case == "wrong-password" else None
    secret = _pull_secret(oci_registry, tmp_path / "secret", password=password)
    uri = oci_model
    if case == "unknown-digest":
        uri = oci_model.rsplit("@", 1)[0] + "@sha256:" + "1" * 64
    args: list[str | Path] = ["--uri", uri]
    if case != "untrusted-certificate":
        args += ["--ca-file", oci_registry.ca_cert]
    if case != "no-secret":
        args += ["--credentials-dir", secret]
    if case == "over-budget":
        args += ["--max-bytes", "1000"]
    return args


# Each failure: the store and the case, and the reason its fetch fails with.
FAILURES = _cases("""
s3/wrong-secret: AccessDenied
s3/anonymous: AccessDenied
s3/missing-prefix: ModelNotFound
s3/missing-bucket: ModelNotFound
s3/other-bucket: AccessDenied
s3/over-budget: ModelTooLarge
s3/other-digest: DigestMismatch
oci/wrong-password: AccessDenied
oci/no-secret: AccessDenied
oci/unknown-digest: ModelNotFound
oci/over-budget: ModelTooLarge
oci/untrusted-certificate: StorageUnreachable
""")


@pytest.mark.parametrize(("case", "reason"), FAILURES.items(), ids=FAILURES)
def test_failures(request: pytest.FixtureRequest, tmp_path: Path, case: str, reason: str) -> None:
    """Each way an S3 or OCI fetch fails leaves nothing installed and names its reason."""
    store, _, what = case.partition("/")
    flags = _s3_failure if store == "s3" else _oci_failure
    run = _fetch(tmp_path / "volume", *flags(request, what, tmp_path))
    _failed(run, reason)
    assert WRONG not in json.dumps(run.report)


# HTTPS (the file server)


@pytest.fixture
def weights(https_files: HttpsFileServer) -> tuple[str, str]:
    """A 512 KiB file on the server: (URL, sha256 digest)."""
    data = FILES["onnx/model.onnx"]
    _write(https_files.root, {"weights/model.onnx": data})
    return https_files.url_for("weights/model.onnx"), f"sha256:{hashlib.sha256(data).hexdigest()}"


def test_https_file_resumes_after_a_cut(
    https_files: HttpsFileServer, weights: tuple[str, str], tmp_path: Path
) -> None:
    """A cut download fails StorageUnreachable; the next run asks only for the rest."""
    url, digest = weights
    https_files.inject(Fault("cut", path="/weights/model.onnx", after_bytes=200_000))
    args: list[str | Path] = ["--uri", url, "--digest", digest, "--ca-file", https_files.ca_cert]
    _failed(_fetch(tmp_path / "volume", *args), "StorageUnreachable")
    run = _fetch(tmp_path / "volume", *args)
    assert run.status == 0, run.report
    assert run.installed() == {"model.onnx": FILES["onnx/model.onnx"]}
    first, second = https_files.requests()
    assert first.range is None
    assert second.range == "bytes=200000-"
    assert second.status == 206


def test_https_archive_is_unpacked(https_files: HttpsFileServer, tmp_path: Path) -> None:
    """A .tar.gz pinned by its SHA-256 is unpacked into the model directory."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        for path, data in FILES.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _write(https_files.root, {"model.tar.gz": packed.getvalue()})
    sha = hashlib.sha256(packed.getvalue()).hexdigest()
    uri = f"{https_files.url_for('model.tar.gz')}#sha256={sha}"
    run = _fetch(tmp_path / "volume", "--uri", uri, "--ca-file", https_files.ca_cert)
    assert run.status == 0, run.report
    assert run.installed() == FILES


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        pytest.param(Fault("stall", path="/weights/model.onnx", after_bytes=10_000, hold_s=30),
                     "StorageUnreachable", id="stall"),
        pytest.param(Fault("error", path="/weights/model.onnx"), "StorageUnreachable", id="500"),
        pytest.param(Fault("error", path="/weights/model.onnx", status=404), "ModelNotFound",
                     id="404"),
    ],
)  # fmt: skip
def test_https_failures(
    https_files: HttpsFileServer,
    weights: tuple[str, str],
    tmp_path: Path,
    fault: Fault,
    reason: str,
) -> None:
    """A stall past the read timeout, a server error and a missing file, each by its reason."""
    url, digest = weights
    https_files.inject(fault)
    run = _fetch(tmp_path / "volume", "--uri", url, "--digest", digest,
                 "--ca-file", https_files.ca_cert, "--read-timeout-s", "2")  # fmt: skip
    _failed(run, reason)
