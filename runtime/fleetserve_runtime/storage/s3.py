"""`s3://bucket/prefix` URIs, through MinIO's client (any S3-compatible store).

Every object under `prefix/` is listed first, and the listed sizes are checked against the
budget and `--max-files` before any body is read; then the objects are fetched, `parallelism`
at once, each to its key's path below the prefix, and each must have its listed size. When
nothing is under `prefix/`, the single object `prefix` is fetched, named by its last part.
Keys ending in `/` (folder markers) are skipped.

Credentials: static keys from the credentials directory; else a web identity token (the
directory's `webIdentityToken` and `roleArn`, or `--s3-web-identity-token-file` and
`--s3-role-arn`) exchanged for temporary keys (AssumeRoleWithWebIdentity, MinIO's
`WebIdentityProvider`) at the STS endpoint (`--s3-sts-endpoint`; else AWS's regional STS for
an AWS endpoint, the S3 endpoint itself elsewhere, as MinIO and SeaweedFS serve STS); else
none (anonymous). Errors: the S3 codes NoSuchBucket and NoSuchKey are
ModelNotFound; AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch and the token codes
AccessDenied; other answers go by HTTP status (`reasons.for_status`); a refused, failed or
timed-out connection and a TLS failure, StorageUnreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
from minio import Minio
from minio.credentials.credentials import Credentials
from minio.credentials.providers import Provider, StaticProvider, WebIdentityProvider
from minio.error import InvalidResponseError, S3Error, ServerError

from fleetserve_runtime.storage.budget import metered
from fleetserve_runtime.storage.context import FetchContext
from fleetserve_runtime.storage.credentials import (
    WebIdentity,
    read_secret,
    s3_keys,
    s3_web_identity,
)
from fleetserve_runtime.storage.options import FetchOptions, S3Settings
from fleetserve_runtime.storage.reasons import FetchFailed, Reason, for_status
from fleetserve_runtime.storage.staging import CHUNK_BYTES, safe_relative_path
from fleetserve_runtime.storage.tls import ca_bundle, check_endpoint
from fleetserve_runtime.storage.uri import S3Uri

__all__ = ["fetch_s3"]

_NOT_FOUND_CODES = frozenset({"NoSuchBucket", "NoSuchKey"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
    }
)
_RETRIES = 2
"""Retries of a refused connection or a 5xx answer (urllib3's): a brief blip is not a failure,
while a store that stays down fails the run soon; the init container's restart retries it."""


@dataclass(frozen=True)
class _Object:
    key: str
    path: str
    """Where it lands, relative to the model directory."""
    size: int


def fetch_s3(uri: S3Uri, ctx: FetchContext) -> None:
    """Fetch every object of `uri` into the staging directory."""
    client = _client(ctx.options)
    with _mapped_errors(str(uri)):
        objects = _listing(client, uri, ctx.options.max_files)
    declared = sum(o.size for o in objects)
    ctx.budget.check_declared(declared, f"{uri} (its listing)")
    ctx.progress.start(declared)
    stop = threading.Event()
    with ThreadPoolExecutor(ctx.options.parallelism, thread_name_prefix="fetch-s3") as pool:
        futures = [pool.submit(_fetch_object, client, uri, o, ctx, stop) for o in objects]
        try:
            for future in as_completed(futures):
                future.result()
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise


def _listing(client: Minio, uri: S3Uri, max_files: int) -> list[_Object]:
    prefix = f"{uri.prefix}/" if uri.prefix else ""
    objects: list[_Object] = []
    for item in client.list_objects(uri.bucket, prefix=prefix, recursive=True):
        key = item.object_name or ""
        if key.endswith("/"):
            continue
        # Checked before any body is read (staging checks again when writing).
        path = safe_relative_path(key[len(prefix) :])
        objects.append(_Object(key, path, item.size or 0))
        if len(objects) > max_files:
            raise FetchFailed(
                Reason.INVALID_ARCHIVE, f"{uri} holds more than {max_files} objects (--max-files)"
            )
    if objects or not uri.prefix:
        return objects
    single = client.stat_object(uri.bucket, uri.prefix)
    return [_Object(uri.prefix, uri.prefix.rsplit("/", 1)[-1], single.size or 0)]


def _fetch_object(
    client: Minio, uri: S3Uri, item: _Object, ctx: FetchContext, stop: threading.Event
) -> None:
    where = f"s3://{uri.bucket}/{item.key}"
    with _mapped_errors(where):
        response = client.get_object(uri.bucket, item.key)
        try:
            chunks = _until(stop, response.stream(CHUNK_BYTES))
            entry = ctx.staging.write(item.path, metered(chunks, ctx.budget, ctx.progress))
        finally:
            response.close()
            response.release_conn()
    if entry.size != item.size:
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE,
            f"{where} has {entry.size} bytes, its listing {item.size}: it changed while fetched",
        )


def _until(stop: threading.Event, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """`chunks` until another object's failure stops the fetch."""
    for chunk in chunks:
        if stop.is_set():
            raise FetchFailed(Reason.STORAGE_UNREACHABLE, "stopped: another object failed")
        yield chunk


def _client(options: FetchOptions) -> Minio:
    settings = options.s3
    check_endpoint(settings.endpoint, allow_http=options.allow_http, flag="--s3-endpoint")
    endpoint = urlsplit(settings.endpoint)
    if endpoint.path.strip("/"):
        raise FetchFailed(
            Reason.INVALID_URI, f"--s3-endpoint {settings.endpoint!r} has a path; give the host"
        )
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=options.connect_timeout_s, read=options.read_timeout_s),
        maxsize=options.parallelism,
        cert_reqs="CERT_REQUIRED",
        ca_certs=ca_bundle(options.ca_file),
        retries=urllib3.Retry(
            total=_RETRIES, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]
        ),
    )
    client = Minio(
        endpoint.netloc,
        secure=endpoint.scheme == "https",
        region=settings.region,
        http_client=http,
        credentials=_credentials(options, http),
    )
    if settings.addressing == "path":
        client.disable_virtual_style_endpoint()  # type: ignore[no-untyped-call]  # untyped upstream
    elif settings.addressing == "virtual":
        client.enable_virtual_style_endpoint()  # type: ignore[no-untyped-call]  # untyped upstream
    return client


def _credentials(options: FetchOptions, http: urllib3.PoolManager) -> Provider | None:
    keys = s3_keys(options.credentials_dir)
    if keys is not None:
        return StaticProvider(keys.access_key, keys.secret_key, keys.session_token)
    settings = options.s3
    identity = s3_web_identity(options.credentials_dir)
    if identity is None and settings.web_identity_token_file is not None:
        identity = WebIdentity(settings.web_identity_token_file, None)
    if identity is None:
        return None
    token_file = identity.token_file
    sts = _sts_endpoint(settings)
    return _Exchange(
        WebIdentityProvider(
            jwt_provider_func=lambda: {"access_token": read_secret(token_file)},
            sts_endpoint=sts,
            role_arn=identity.role_arn or settings.role_arn,
            http_client=http,
        ),
        sts,
    )


def _sts_endpoint(settings: S3Settings) -> str:
    """`--s3-sts-endpoint`; else AWS's STS for an AWS endpoint, the S3 endpoint elsewhere."""
    if settings.sts_endpoint is not None:
        return settings.sts_endpoint
    if (urlsplit(settings.endpoint).hostname or "").endswith(".amazonaws.com"):
        region = f".{settings.region}" if settings.region else ""
        return f"https://sts{region}.amazonaws.com"
    return settings.endpoint


class _Exchange(Provider):
    """A token exchange whose refusal is AccessDenied (MinIO raises a bare ValueError)."""

    def __init__(self, inner: Provider, sts: str) -> None:
        self._inner = inner
        self._sts = sts

    def retrieve(self) -> Credentials:
        try:
            return self._inner.retrieve()
        except ValueError as exc:
            raise FetchFailed(
                Reason.ACCESS_DENIED, f"the web identity exchange at {self._sts} failed: {exc}"
            ) from exc


@contextmanager
def _mapped_errors(what: str) -> Iterator[None]:
    """MinIO's and urllib3's errors as the failure they mean, fetching `what`."""
    try:
        yield
    except S3Error as exc:
        raise _s3_failure(exc, what) from exc
    except ServerError as exc:
        raise for_status(exc.status_code, what) from exc
    except InvalidResponseError as exc:
        raise FetchFailed(Reason.STORAGE_UNREACHABLE, f"{what}: {exc}") from exc
    except urllib3.exceptions.HTTPError as exc:
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE, f"{what}: {type(exc).__name__}: {exc}"
        ) from exc


def _s3_failure(exc: S3Error, what: str) -> FetchFailed:
    code = exc.code or ""
    if code in _NOT_FOUND_CODES:
        return FetchFailed(Reason.MODEL_NOT_FOUND, f"{what}: {code}")
    if code in _DENIED_CODES:
        return FetchFailed(Reason.ACCESS_DENIED, f"{what}: {code}")
    failure = for_status(exc.response.status, what)
    return FetchFailed(failure.reason, f"{failure.message} ({code})")
