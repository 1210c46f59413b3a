"""SeaweedFS's S3 server, driven by the minio client: TLS, its three keys, its errors."""

from __future__ import annotations

import io
import ssl
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import urllib3
from minio import Minio
from minio.error import S3Error

from fleetserve_e2e.listeners import listening_addresses
from fleetserve_e2e.object_store import LocalObjectStore, ObjectStore, S3Credentials

PAYLOAD = bytes(range(256)) * 1024  # 256 KiB, every byte value


def _key() -> str:
    return f"tests/{uuid.uuid4().hex}/weights.bin"


def _put(client: Minio, bucket: str, key: str, data: bytes) -> None:
    client.put_object(bucket, key, io.BytesIO(data), len(data))


def _read(client: Minio, bucket: str, key: str, offset: int = 0, length: int = 0) -> bytes:
    response = client.get_object(bucket, key, offset=offset, length=length)
    try:
        return response.read()
    finally:
        response.close()
        response.release_conn()


def _error_code(call: Callable[[], object]) -> str:
    with pytest.raises(S3Error) as raised:
        call()
    return str(raised.value.code)


def test_read_write_key_puts_and_gets_over_tls(object_store: ObjectStore) -> None:
    """An object written with the read-write key reads back whole, and by byte range."""
    client = object_store.client(object_store.read_write)
    key = _key()
    _put(client, object_store.bucket, key, PAYLOAD)

    assert _read(client, object_store.bucket, key) == PAYLOAD
    assert _read(client, object_store.bucket, key, offset=1000, length=300) == PAYLOAD[1000:1300]
    assert client.stat_object(object_store.bucket, key).size == len(PAYLOAD)
    folder = key.rsplit("/", 1)[0] + "/"
    listed = client.list_objects(object_store.bucket, prefix=folder, recursive=True)
    assert [entry.object_name for entry in listed] == [key]


def test_upload_directory_keeps_relative_paths(object_store: ObjectStore, tmp_path: Path) -> None:
    """`upload_directory` lays a model folder out under a prefix, subfolders included."""
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    prefix = f"models/{uuid.uuid4().hex}"

    keys = object_store.upload_directory(tmp_path, prefix)

    assert keys == [f"{prefix}/config.json", f"{prefix}/tokenizer/vocab.txt"]
    reader = object_store.client(object_store.read_only)
    assert _read(reader, object_store.bucket, keys[1]) == b"a\nb\n"


def test_read_only_key_reads_but_cannot_write(object_store: ObjectStore) -> None:
    """The read-only key gets and lists what the read-write key wrote; its put is refused."""
    key = _key()
    _put(object_store.client(object_store.read_write), object_store.bucket, key, b"weights")
    reader = object_store.client(object_store.read_only)

    assert _read(reader, object_store.bucket, key) == b"weights"
    code = _error_code(lambda: _put(reader, object_store.bucket, _key(), b"nope"))
    assert code == "AccessDenied"
    code = _error_code(lambda: reader.remove_object(object_store.bucket, key))
    assert code == "AccessDenied"


def test_wrong_secret_and_unknown_key_are_refused(object_store: ObjectStore) -> None:
    """A known key signed with the wrong secret, and a key nobody has, get no object."""
    key = _key()
    _put(object_store.client(object_store.read_write), object_store.bucket, key, b"weights")
    wrong_secret = S3Credentials(object_store.read_write.access_key, "0" * 40)
    unknown = S3Credentials.random("FSNO")

    bad_signature = object_store.client(wrong_secret)
    assert _error_code(lambda: _read(bad_signature, object_store.bucket, key)) == (
        "SignatureDoesNotMatch"
    )
    stranger = object_store.client(unknown)
    assert _error_code(lambda: _read(stranger, object_store.bucket, key)) == "InvalidAccessKeyId"


def test_anonymous_requests_are_denied(object_store: ObjectStore) -> None:
    """With no anonymous identity, an unsigned GET of an existing object is AccessDenied."""
    key = _key()
    _put(object_store.client(object_store.read_write), object_store.bucket, key, b"weights")
    context = ssl.create_default_context(cafile=str(object_store.ca_cert))

    response = httpx.get(
        f"{object_store.endpoint_url}/{object_store.bucket}/{key}", verify=context, timeout=10.0
    )

    assert response.status_code == httpx.codes.FORBIDDEN
    assert "<Code>AccessDenied</Code>" in response.text


def test_missing_key_and_bucket(object_store: ObjectStore) -> None:
    """A missing object is NoSuchKey; a missing bucket NoSuchBucket, or AccessDenied to a key.

    A key limited to the one bucket may not learn which other buckets exist.
    """
    client = object_store.client(object_store.read_write)
    assert _error_code(lambda: _read(client, object_store.bucket, _key())) == "NoSuchKey"
    assert _error_code(lambda: client.stat_object(object_store.bucket, _key())) == "NoSuchKey"

    admin = object_store.client(object_store.admin)
    assert _error_code(lambda: _read(admin, "absent-bucket", "x")) == "NoSuchBucket"
    assert _error_code(lambda: _read(client, "absent-bucket", "x")) == "AccessDenied"


def test_server_certificate_is_verified(object_store: ObjectStore) -> None:
    """A client that trusts only the system CAs refuses the server: TLS is real, not skipped."""
    untrusting = Minio(
        object_store.endpoint,
        access_key=object_store.read_write.access_key,
        secret_key=object_store.read_write.secret_key,
        secure=True,
        region=object_store.region,
        http_client=urllib3.PoolManager(cert_reqs="CERT_REQUIRED", retries=False),
    )
    with pytest.raises(urllib3.exceptions.SSLError):
        untrusting.bucket_exists(object_store.bucket)


def test_plain_http_is_not_served(object_store: ObjectStore) -> None:
    """The S3 port speaks only TLS."""
    plain = object_store.endpoint_url.replace("https://", "http://")
    response = httpx.get(f"{plain}/{object_store.bucket}", timeout=10.0)
    assert response.status_code == httpx.codes.BAD_REQUEST


def test_every_listener_is_on_loopback(object_store_server: LocalObjectStore) -> None:
    """Master, volume server, filer and S3 gateway bind 127.0.0.1 and nothing else."""
    assert object_store_server.process is not None
    addresses = listening_addresses(object_store_server.process.pid)
    assert addresses, "weed holds no listening socket"
    assert {host for host, _port in addresses} == {"127.0.0.1"}
