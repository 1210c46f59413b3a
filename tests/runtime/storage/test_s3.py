"""S3 prefixes through MinIO's client, against a loopback store laid out as routes.

The routes answer the three calls the fetch makes (ListObjectsV2 on the bucket, HEAD and GET
on an object), path-style, with S3's XML errors; signatures are not checked. The real-store
tests (SeaweedFS) live with the e2e storage servers.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from fleetserve_e2e.pki import ClusterPki

from fleetserve_runtime.storage.digests import FileEntry, tree_digest
from fleetserve_runtime.storage.options import FetchOptions, S3Settings
from fleetserve_runtime.storage.reasons import Reason
from tests.runtime.storage.fetching import failed_fetch, run_fetch
from tests.runtime.storage.file_server import FileServer, Route

OBJECTS = {
    "enc/2/config.json": b'{"hidden_size": 8}',
    "enc/2/onnx/model.onnx": bytes(range(256)) * 64,
    "enc/2/tokenizer.json": b"{}",
}
XML = {"Content-Type": "application/xml"}


def _listing(objects: dict[str, int]) -> bytes:
    contents = "".join(
        f"<Contents><Key>{key}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
        f'<ETag>"e"</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>'
        for key, size in objects.items()
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>models</Name><KeyCount>{len(objects)}</KeyCount><MaxKeys>1000</MaxKeys>"
        f"<IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
    ).encode()


def _error(code: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>m</Message><Resource>/models</Resource><RequestId>1</RequestId></Error>"
    ).encode()


def _store(server: FileServer, objects: dict[str, bytes], **listed: int) -> None:
    """A bucket `models` holding `objects` (listed with their sizes, or those of `listed`)."""
    sizes = {key: len(data) for key, data in objects.items()} | listed
    server.routes["/models"] = Route(body=_listing(sizes), headers=XML)
    for key, data in objects.items():
        server.routes[f"/models/{key}"] = Route(
            body=data, headers={"Last-Modified": "Thu, 01 Jan 2026 00:00:00 GMT"}
        )


def _options(server: FileServer, pki: ClusterPki, tmp_path: Path, **overrides: Any) -> FetchOptions:
    settings: dict[str, Any] = {
        "dest": tmp_path / "volume",
        "ca_file": pki.ca_cert,
        "s3": S3Settings(endpoint=server.url(""), region="us-east-1"),
    }
    settings.update(overrides)
    return FetchOptions(**settings)


def test_every_object_under_the_prefix(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """Objects land at their keys below the prefix; folder markers are skipped; tree digest."""
    _store(server, {**OBJECTS, "enc/2/onnx/": b""})
    options = _options(server, pki, tmp_path)
    fetched = run_fetch("s3://models/enc/2", options)
    model = options.dest / "model"
    for key, data in OBJECTS.items():
        assert (model / key.removeprefix("enc/2/")).read_bytes() == data
    entries = [
        FileEntry(key.removeprefix("enc/2/"), len(data), hashlib.sha256(data).hexdigest())
        for key, data in OBJECTS.items()
    ]
    assert fetched.record.digest == str(tree_digest(entries))
    listing = next(seen for seen in server.seen if seen.path.startswith("/models?"))
    assert "prefix=enc%2F2%2F" in listing.path


def test_listed_sizes_over_budget(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """The listing's sizes over --max-bytes fail ModelTooLarge before any object is read."""
    _store(server, OBJECTS)
    failure = failed_fetch("s3://models/enc/2", _options(server, pki, tmp_path, max_bytes=1000))
    assert failure.reason is Reason.MODEL_TOO_LARGE
    assert not any(seen.path.startswith("/models/enc") for seen in server.seen)


def test_object_unlike_its_listing(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """An object that is not the size its listing said fails: it changed under the fetch."""
    _store(server, OBJECTS, **{"enc/2/tokenizer.json": 5})
    failure = failed_fetch("s3://models/enc/2", _options(server, pki, tmp_path))
    assert failure.reason is Reason.STORAGE_UNREACHABLE
    assert "changed" in failure.message


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        (404, "NoSuchBucket", Reason.MODEL_NOT_FOUND),
        (403, "AccessDenied", Reason.ACCESS_DENIED),
        (403, "InvalidAccessKeyId", Reason.ACCESS_DENIED),
        (403, "SignatureDoesNotMatch", Reason.ACCESS_DENIED),
        (400, "InvalidToken", Reason.ACCESS_DENIED),
    ],
)
def test_s3_error_codes(
    server: FileServer, pki: ClusterPki, tmp_path: Path, status: int, code: str, reason: Reason
) -> None:
    """The store's error code decides the reason; the message names the code."""
    server.routes["/models"] = Route(status=status, body=_error(code), headers=XML)
    failure = failed_fetch("s3://models/enc/2", _options(server, pki, tmp_path))
    assert failure.reason is reason
    assert code in failure.message


def test_server_errors_are_retried_briefly(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A 503 is retried twice, then StorageUnreachable."""
    _store(server, OBJECTS)
    server.routes["/models/enc/2/config.json"].status = 503
    failure = failed_fetch("s3://models/enc/2", _options(server, pki, tmp_path))
    assert failure.reason is Reason.STORAGE_UNREACHABLE
    asked = [seen for seen in server.seen if seen.path == "/models/enc/2/config.json"]
    assert len(asked) == 3


def test_a_single_object(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """Nothing under `prefix/`: the object `prefix` itself, named by its last part."""
    data = OBJECTS["enc/2/onnx/model.onnx"]
    _store(server, {"enc/model.onnx": data})
    server.routes["/models"] = Route(body=_listing({}), headers=XML)
    options = _options(server, pki, tmp_path)
    run_fetch("s3://models/enc/model.onnx", options)
    assert (options.dest / "model/model.onnx").read_bytes() == data


def test_nothing_there(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """No object under the prefix and none named by it: ModelNotFound."""
    server.routes["/models"] = Route(body=_listing({}), headers=XML)
    assert (
        failed_fetch("s3://models/enc/2", _options(server, pki, tmp_path)).reason
        is Reason.MODEL_NOT_FOUND
    )


def test_key_leaving_the_model_directory(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """A key whose path below the prefix has a `..` part: InvalidArchive."""
    _store(server, {"enc/2/../../escape": b"x"})
    failure = failed_fetch("s3://models/enc/2", _options(server, pki, tmp_path))
    assert failure.reason is Reason.INVALID_ARCHIVE
    assert not (tmp_path / "escape").exists()


def test_static_keys_sign_and_stay_secret(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """Keys from the credentials directory sign each request; the secret shows nowhere."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "accessKeyId").write_text("AKIAFETCHTEST")
    (secret / "secretAccessKey").write_text("fetch-secret-key-value")
    server.routes["/models"] = Route(status=403, body=_error("SignatureDoesNotMatch"), headers=XML)
    failure = failed_fetch(
        "s3://models/enc/2", _options(server, pki, tmp_path, credentials_dir=secret)
    )
    assert "Credential=AKIAFETCHTEST/" in server.seen[0].headers["authorization"]
    assert "fetch-secret-key-value" not in failure.message
    assert "AKIAFETCHTEST" not in failure.message


def test_plain_http_endpoint_needs_allow_http(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """An http:// endpoint is InvalidUri unless --allow-http, before any request."""
    options = _options(
        server, pki, tmp_path, s3=S3Settings(endpoint="http://127.0.0.1:9", region="us-east-1")
    )
    failure = failed_fetch("s3://models/enc/2", options)
    assert failure.reason is Reason.INVALID_URI
    assert "--allow-http" in failure.message


def _sts_answer(access_key: str) -> bytes:
    return (
        '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
        "<AssumeRoleWithWebIdentityResult><Credentials>"
        f"<AccessKeyId>{access_key}</AccessKeyId><SecretAccessKey>temporary-secret</SecretAccessKey>"
        "<SessionToken>temporary-session-token</SessionToken>"
        "<Expiration>2099-01-01T00:00:00Z</Expiration>"
        "</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
    ).encode()


def test_web_identity_from_the_credentials_dir(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """The Secret's webIdentityToken and roleArn are exchanged for keys that sign the fetch."""
    _store(server, OBJECTS)
    server.routes["/sts"] = Route(body=_sts_answer("ASIATEMPORARY"), headers=XML)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "webIdentityToken").write_text("eyJ-web-identity-token")
    (secret / "roleArn").write_text("arn:aws:iam::123:role/fetch")
    settings = S3Settings(
        endpoint=server.url(""), region="us-east-1", sts_endpoint=server.url("/sts")
    )
    options = _options(server, pki, tmp_path, credentials_dir=secret, s3=settings)
    run_fetch("s3://models/enc/2", options)
    exchange = next(seen for seen in server.seen if seen.path.startswith("/sts"))
    assert exchange.method == "POST"
    assert "Action=AssumeRoleWithWebIdentity" in exchange.path
    assert "WebIdentityToken=eyJ-web-identity-token" in exchange.path
    assert "RoleArn=arn%3Aaws%3Aiam%3A%3A123%3Arole%2Ffetch" in exchange.path
    signed = [seen for seen in server.seen if seen.path.startswith("/models")]
    assert all("Credential=ASIATEMPORARY/" in seen.headers["authorization"] for seen in signed)
    assert all(seen.headers["x-amz-security-token"] == "temporary-session-token" for seen in signed)


def test_refused_web_identity_is_access_denied(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """An exchange the STS refuses is AccessDenied, and the token shows in no message."""
    server.routes["/sts"] = Route(status=403, body=_error("AccessDenied"), headers=XML)
    token = tmp_path / "token"
    token.write_text("eyJ-refused-token")
    settings = S3Settings(
        endpoint=server.url(""),
        region="us-east-1",
        sts_endpoint=server.url("/sts"),
        web_identity_token_file=token,
        role_arn="arn:aws:iam::123:role/fetch",
    )
    failure = failed_fetch("s3://models/enc/2", _options(server, pki, tmp_path, s3=settings))
    assert failure.reason is Reason.ACCESS_DENIED
    assert "eyJ-refused-token" not in failure.message
    assert "web identity" in failure.message
