"""A real S3 server on loopback: SeaweedFS (``weed server -s3``) with TLS and static identities.

One ``weed server`` process runs SeaweedFS's master, volume server, filer and S3 gateway, every
listener on 127.0.0.1 (HTTP and gRPC ports picked free, so several can run side by side; the
Iceberg and Lance side ports, the embedded IAM API and telemetry are off), data in a temporary
directory. The S3 gateway serves only HTTPS, with a certificate signed by the CA it is given.
Besides its TCP ports, ``weed server`` keeps Unix sockets for its own gRPC calls at fixed
``/tmp/seaweedfs-*-grpc-<port>.sock`` paths; they are removed when it stops.

Its identities come from a static config file (``-s3.config``): an admin (creates the bucket),
a read-write key and a read-only key, both limited to the one bucket; there is no anonymous
identity, so an unsigned request is refused. Keys are random per start.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from minio import Minio

from fleetserve_e2e.lifecycle import Component, WorkDir, started
from fleetserve_e2e.pki import LocalCa, TlsFiles, issue_loopback_cert
from fleetserve_e2e.ports import PortSet
from fleetserve_e2e.processes import MARKER_ENV, ManagedProcess, start_process
from fleetserve_e2e.storage_tools import ensure_seaweedfs
from fleetserve_e2e.waiting import wait_until

# SeaweedFS's default region; clients that sign with it never need a location lookup.
REGION = "us-east-1"
_START_TIMEOUT_S = 90.0
_STOP_GRACE_S = 1.0
_READY_PROBE = ".fleetserve-ready"

S3_SERVER_NAME = "seaweedfs-s3"
"""The name in the server's certificate (beside localhost and 127.0.0.1), by which a
container reaches it (`LocalCluster(host_names=...)`)."""


def tree_digest(files: Mapping[str, bytes]) -> str:
    """The digest of an S3 prefix holding `files` (path -> bytes), as a test expects it.

    Computed here as docs/reference/model-storage.md defines it, not by the runtime's code, so
    a test catches a runtime that strays from the documented digest.
    """
    lines = b"".join(
        f"{path}\0{len(data)}\0{hashlib.sha256(data).hexdigest()}\n".encode()
        for path, data in sorted(files.items(), key=lambda item: item[0].encode())
    )
    return f"sha256:{hashlib.sha256(lines).hexdigest()}"


@dataclass(frozen=True)
class S3Credentials:
    """An access key and its secret."""

    access_key: str
    secret_key: str

    @classmethod
    def random(cls, prefix: str) -> S3Credentials:
        """A fresh key pair shaped like AWS's (20-character key, 40-character secret)."""
        key = prefix + secrets.token_hex(10).upper()
        return cls(access_key=key[:20], secret_key=secrets.token_hex(20))


@dataclass(frozen=True)
class ObjectStore:
    """What a test needs to reach a running S3 server.

    Attributes:
        endpoint_url: ``https://127.0.0.1:<port>`` (what boto3 and most S3 clients take).
        endpoint: ``127.0.0.1:<port>`` (what the minio client takes, with ``secure=True``).
        ca_cert: The PEM CA that signed the server's certificate.
        bucket: The bucket that exists from the start, and that the two keys are limited to.
        region: The region requests are signed for.
        read_write: May read, list, write and delete objects in ``bucket``.
        read_only: May read and list objects in ``bucket``.
        admin: May do anything, including creating buckets.
    """

    endpoint_url: str
    endpoint: str
    ca_cert: Path
    bucket: str
    region: str
    read_write: S3Credentials
    read_only: S3Credentials
    admin: S3Credentials

    def client(self, credentials: S3Credentials) -> Minio:
        """A minio client signing with ``credentials``, trusting only ``ca_cert``."""
        http = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED",
            ca_certs=str(self.ca_cert),
            retries=urllib3.Retry(total=0),
        )
        return Minio(
            self.endpoint,
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            secure=True,
            region=self.region,
            http_client=http,
        )

    def upload_directory(self, directory: Path, prefix: str) -> list[str]:
        """Upload every file under ``directory`` to ``bucket`` under ``prefix`` (read-write key).

        Returns the object keys, sorted.
        """
        client = self.client(self.read_write)
        keys = []
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            key = f"{prefix.strip('/')}/{path.relative_to(directory).as_posix()}".lstrip("/")
            client.fput_object(self.bucket, key, str(path))
            keys.append(key)
        return keys


def s3_identities(
    bucket: str, *, admin: S3Credentials, read_write: S3Credentials, read_only: S3Credentials
) -> dict[str, Any]:
    """The ``-s3.config`` document: admin, read-write and read-only keys, no anonymous one.

    SeaweedFS scopes an action to a bucket as ``Action:bucket``.
    """

    def identity(name: str, credentials: S3Credentials, actions: list[str]) -> dict[str, Any]:
        keys = {"accessKey": credentials.access_key, "secretKey": credentials.secret_key}
        return {"name": name, "credentials": [keys], "actions": actions}

    on_bucket = [f"{action}:{bucket}" for action in ("Read", "List", "Write", "Tagging")]
    return {
        "identities": [
            identity("fleetserve-admin", admin, ["Admin", "Read", "List", "Write"]),
            identity("fleetserve-read-write", read_write, on_bucket),
            identity("fleetserve-read-only", read_only, on_bucket[:2]),
        ]
    }


@dataclass(frozen=True)
class _Ports(PortSet):
    """Every port one ``weed server`` listens on: HTTP and gRPC for each of its four parts."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int

    def grpc_sockets(self) -> list[Path]:
        """The Unix sockets ``weed server`` adds for its own gRPC calls, at fixed /tmp paths."""
        parts = {
            "master": self.master_grpc,
            "volume": self.volume_grpc,
            "filer": self.filer_grpc,
            "s3": self.s3_grpc,
        }
        return [Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock") for name, port in parts.items()]


def weed_server_argv(
    binary: Path, work_dir: Path, ports: _Ports, tls: TlsFiles, config: Path
) -> list[str]:
    """The ``weed server`` command line: four parts on 127.0.0.1, S3 over TLS only."""
    return [
        str(binary),
        # Into the process's log, not into log files of its own in the system temp dir.
        "-logtostderr=true",
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={work_dir / 'data'}",
        f"-master.port={ports.master}",
        f"-master.port.grpc={ports.master_grpc}",
        # On by default, it would report to the SeaweedFS project over the internet.
        "-master.telemetry=false",
        # Small volumes: a test writes megabytes, and each volume is a file of its own.
        "-master.volumeSizeLimitMB=64",
        f"-volume.port={ports.volume}",
        f"-volume.port.grpc={ports.volume_grpc}",
        "-volume.max=0",
        "-volume.preStopSeconds=0",
        f"-filer.port={ports.filer}",
        f"-filer.port.grpc={ports.filer_grpc}",
        f"-filer.localSocket={work_dir / 'filer.sock'}",
        "-s3",
        f"-s3.port={ports.s3}",
        f"-s3.port.grpc={ports.s3_grpc}",
        f"-s3.localSocket={work_dir / 's3.sock'}",
        f"-s3.cert.file={tls.cert}",
        f"-s3.key.file={tls.key}",
        f"-s3.config={config}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.iam=false",
        "-s3.autoCreateBucket=false",
    ]


class LocalObjectStore(Component):
    """Context manager running SeaweedFS's S3 server with one bucket; stopped on exit.

    Args:
        ca: The CA that signs the server's certificate.
        bucket: The bucket to create.
        work_dir: Data, config, certificate and log; a temp dir removed on exit when None.
    """

    def __init__(
        self, ca: LocalCa, *, bucket: str = "models", work_dir: Path | None = None
    ) -> None:
        """Configure; nothing starts before ``__enter__``."""
        self._ca = ca
        self._bucket = bucket
        self._work_dir = WorkDir(work_dir, prefix="fleetserve-s3-")
        self.process: ManagedProcess | None = None
        self._store: ObjectStore | None = None
        self._ports: _Ports | None = None

    @property
    def store(self) -> ObjectStore:
        """The running server's address, CA, bucket and keys.

        Raises:
            RuntimeError: The server has not started.
        """
        return started(self._store, "the object store")

    def _start(self) -> None:
        binary = ensure_seaweedfs()
        work_dir = self._work_dir.make()
        (work_dir / "data").mkdir(parents=True, exist_ok=True)
        tls = issue_loopback_cert(self._ca, work_dir / "tls", S3_SERVER_NAME)
        ports = self._ports = _Ports.pick()
        store = ObjectStore(
            endpoint_url=f"https://127.0.0.1:{ports.s3}",
            endpoint=f"127.0.0.1:{ports.s3}",
            ca_cert=self._ca.cert,
            bucket=self._bucket,
            region=REGION,
            read_write=S3Credentials.random("FSRW"),
            read_only=S3Credentials.random("FSRO"),
            admin=S3Credentials.random("FSAD"),
        )
        config = work_dir / "s3.json"
        identities = s3_identities(
            self._bucket,
            admin=store.admin,
            read_write=store.read_write,
            read_only=store.read_only,
        )
        config.write_text(json.dumps(identities, indent=2), encoding="utf-8")
        # No SENTRY_DSN: `weed` would send crash reports to it.
        env = {k: v for k, v in os.environ.items() if k != "SENTRY_DSN"}
        self.process = start_process(
            "seaweedfs",
            weed_server_argv(binary, work_dir, ports, tls, config),
            log_path=work_dir / "weed.log",
            env={**env, MARKER_ENV: str(work_dir)},
            cwd=work_dir,
        )
        self._store = store
        admin = store.client(store.admin)
        wait_until(
            lambda: self._bucket_ready(admin),
            timeout_s=_START_TIMEOUT_S,
            what="SeaweedFS to create the bucket and store an object",
        )

    def _bucket_ready(self, admin: Minio) -> bool:
        """Create the bucket if needed, then write and delete an object (volumes are ready)."""
        if self.process is not None:
            self.process.ensure_running()
        if not admin.bucket_exists(self._bucket):
            admin.make_bucket(self._bucket)
        admin.put_object(self._bucket, _READY_PROBE, io.BytesIO(b""), 0)
        admin.remove_object(self._bucket, _READY_PROBE)
        return True

    def close(self) -> None:
        """Stop the server and remove an owned work dir (idempotent)."""
        if self.process is not None:
            # A graceful stop takes 15 s (the filer's last metadata flush waits for the volume
            # server, which has stopped first); the data is thrown away, so it is not awaited.
            self.process.stop(grace_s=_STOP_GRACE_S)
        if self._ports is not None:
            for leftover in self._ports.grpc_sockets():
                leftover.unlink(missing_ok=True)
        self._work_dir.remove()
