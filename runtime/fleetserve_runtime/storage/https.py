"""`https://` URIs (and `http://` with --allow-http): one file, or an archive unpacked.

The file downloads into `resume/<sha256>`, which outlives a failed run, so the next run asks
only for the rest: `Range: bytes=<have>-` with `If-Range:` the first answer's strong ETag
(else its Last-Modified). The server answers 206 with the rest, or 200 with the whole file
(it changed, or it ignores ranges), which starts the file over. A whole file left by a run
that failed after downloading it is taken as it is, without a request. The SHA-256 of the
whole file must be the pinned one (`--digest`, or the URI's `#sha256=`), else
DigestMismatch, and the partial file goes. Bytes are taken as sent (`Accept-Encoding:
identity`, no decoding), so what is hashed is what the server holds.

A Content-Length over the budget fails before the body is read; a body without one stops at
the budget. 401 and 403: AccessDenied; 404 and 410: ModelNotFound; any other status, a
refused or failed connection, a TLS failure, a body that ends early or no bytes for the read
timeout: StorageUnreachable. Redirects are followed, but not to plain http unless allowed.
A bearer token in the credentials directory's `token` file is sent when there is one.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

import httpx2

from fleetserve_runtime.storage.archive import archive_kind, unpack
from fleetserve_runtime.storage.budget import ByteBudget, metered
from fleetserve_runtime.storage.context import FetchContext
from fleetserve_runtime.storage.credentials import bearer_token
from fleetserve_runtime.storage.digests import Digest
from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.reasons import FetchFailed, Reason, for_status
from fleetserve_runtime.storage.staging import chunks_of
from fleetserve_runtime.storage.tls import http_client
from fleetserve_runtime.storage.uri import HttpsUri

if TYPE_CHECKING:
    from _hashlib import HASH

__all__ = ["fetch_https"]

_CONTENT_RANGE = re.compile(r"bytes (\d+)-\d+/(?:\d+|\*)")


def fetch_https(uri: HttpsUri, ctx: FetchContext) -> Digest:
    """Fetch `uri` into the staging directory; its digest is the file's SHA-256."""
    download = ctx.resume_dir / uri.sha256.hex
    _download(uri, download, ctx)
    kind = archive_kind(uri.filename)
    if kind is None:
        ctx.staging.adopt(uri.filename, download, uri.sha256.hex)
        return uri.sha256
    try:
        unpack(download, kind, ctx.staging, ctx.budget, ctx.options.max_files)
    finally:
        download.unlink()
    return uri.sha256


def _download(uri: HttpsUri, path: Path, ctx: FetchContext) -> None:
    """`path` holds the file `uri` pins when this returns (resuming what is there)."""
    validator_path = path.with_name(f"{path.name}.validator")
    prefix = hashlib.sha256()
    have = _feed(prefix, path)
    if have and prefix.hexdigest() == uri.sha256.hex:
        # Downloaded whole by a run that failed after it (a server would answer 416).
        validator_path.unlink(missing_ok=True)
        return
    headers = _headers(ctx.options, have, validator_path)
    try:
        with (
            http_client(ctx.options, []) as client,
            client.stream("GET", uri.url, headers=headers) as response,
        ):
            offset = _offset(response, have, uri, path)
            _remember_validator(response, validator_path, fresh=offset == 0)
            hasher = prefix if offset else hashlib.sha256()
            sha256 = _receive(response, path, offset, hasher, ctx, str(uri))
    except httpx2.TimeoutException as exc:
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE,
            f"{uri}: {type(exc).__name__}: no answer within the timeout "
            f"({ctx.options.connect_timeout_s:g} s to connect, {ctx.options.read_timeout_s:g} s "
            "between bytes)",
        ) from exc
    except httpx2.TransportError as exc:
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE, f"{uri}: {type(exc).__name__}: {exc}"
        ) from exc
    validator_path.unlink(missing_ok=True)
    if sha256 != uri.sha256.hex:
        path.unlink()
        raise FetchFailed(
            Reason.DIGEST_MISMATCH, f"{uri}: the file fetched has the digest sha256:{sha256}"
        )


def _headers(options: FetchOptions, have: int, validator_path: Path) -> dict[str, str]:
    headers = {"Accept-Encoding": "identity"}
    token = bearer_token(options.credentials_dir)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if have:
        headers["Range"] = f"bytes={have}-"
        if validator_path.exists():
            headers["If-Range"] = validator_path.read_text()
    return headers


def _feed(hasher: HASH, path: Path) -> int:
    """Feed the bytes of `path` (if it exists) to `hasher`; how many there were."""
    if not path.exists():
        return 0
    with path.open("rb") as partial:
        for chunk in chunks_of(partial):
            hasher.update(chunk)
    return path.stat().st_size


def _receive(
    response: httpx2.Response,
    path: Path,
    offset: int,
    hasher: HASH,
    ctx: FetchContext,
    source: str,
) -> str:
    """Write the body at `offset` of `path`; the SHA-256 (hex) of the whole file.

    `hasher` has been fed the `offset` bytes already there.
    """
    budget = ByteBudget(ctx.options.max_bytes, "the download")
    length = response.headers.get("content-length", "")
    total = offset + int(length) if length.isdigit() else None
    if total is not None:
        budget.check_declared(total, f"{source} (Content-Length)")
    ctx.progress.start(total)
    budget.charge(offset)
    ctx.progress.advance(offset)
    with path.open("ab" if offset else "wb") as out:
        for chunk in metered(response.iter_raw(), budget, ctx.progress):
            out.write(chunk)
            hasher.update(chunk)
    return hasher.hexdigest()


def _offset(response: httpx2.Response, have: int, uri: HttpsUri, path: Path) -> int:
    """Where the body starts in the file: `have` for the rest (206), 0 for all of it (200)."""
    if response.status_code == 200:
        return 0
    if response.status_code == 206:
        match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", ""))
        if have and match is not None and int(match.group(1)) == have:
            return have
        path.unlink(missing_ok=True)
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE,
            f"{uri}: the server sent a range that does not continue the partial download",
        )
    if response.status_code == 416:
        # The partial file is not a prefix of what the server has: start over next time.
        path.unlink(missing_ok=True)
    raise for_status(response.status_code, str(uri))


def _remember_validator(response: httpx2.Response, path: Path, *, fresh: bool) -> None:
    """Keep what a later `If-Range` sends: a strong ETag, else Last-Modified (fresh files)."""
    if not fresh:
        return
    etag = response.headers.get("etag")
    validator = (
        etag if etag and not etag.startswith("W/") else response.headers.get("last-modified")
    )
    if validator:
        path.write_text(validator)
    else:
        path.unlink(missing_ok=True)
