"""One fetch from start to end: parse, reuse a matching install, stage, fetch, verify, install.

With a node cache (`--cache-dir`), a pinned digest the cache holds is restored from it instead
of the store (checked byte for byte, `node_cache.restore`), and a model fetched from the store
is published to it once installed.

The digest a fetch produces is the one its store pins (the manifest digest of an `oci://`
URI, the SHA-256 of an `https://` file) or else the tree digest of the files fetched (`s3://`,
`hf://`); `--digest`, when given, must equal it, else DigestMismatch and nothing is installed.
Each scheme's fetcher is imported only when its scheme is asked for: an init container
fetching over HTTPS never loads the S3, OCI or Hugging Face clients.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from fleetserve_runtime.storage.budget import ByteBudget
from fleetserve_runtime.storage.context import FetchContext
from fleetserve_runtime.storage.digests import Digest, tree_digest
from fleetserve_runtime.storage.install import (
    InstallRecord,
    abandon,
    commit,
    finish,
    installed,
    prepare,
)
from fleetserve_runtime.storage.node_cache import CacheOutcome, publish, restore
from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.progress import Emit, Progress
from fleetserve_runtime.storage.reasons import FetchFailed, Reason
from fleetserve_runtime.storage.redact import scrub
from fleetserve_runtime.storage.staging import Staging
from fleetserve_runtime.storage.tls import client_context
from fleetserve_runtime.storage.uri import HttpsUri, ModelUri, OciUri, S3Uri, parse_uri

__all__ = ["Fetched", "fetch"]


@dataclass(frozen=True)
class Fetched:
    """The install a fetch produced, or found already in place (`reused`)."""

    record: InstallRecord
    reused: bool
    cache: CacheOutcome | None = None
    """What the node cache did; None without one."""


def fetch(uri_text: str, options: FetchOptions, emit: Emit) -> Fetched:
    """Fetch `uri_text` into `options.dest`; progress events go to `emit`.

    Raises `FetchFailed` with the reason; nothing is then installed.
    """
    uri = parse_uri(uri_text, allow_http=options.allow_http, digest=options.digest)
    pins = _pins(uri, options.digest)
    if options.cache_dir is not None and not pins:
        raise FetchFailed(
            Reason.INVALID_URI,
            f"--cache-dir needs a pinned digest (--digest, or an oci:// URI's) to key {uri} by",
        )
    source = scrub(str(uri))
    found = installed(options.dest, uri=source, pins=pins, max_bytes=options.max_bytes)
    if found is not None:
        return Fetched(found, reused=True)
    if options.ca_file is not None:
        client_context(options.ca_file)
    staging_dir, resume_dir = prepare(options.dest)
    if options.cache_dir is not None:
        cached = restore(options.cache_dir, pins[0], staging_dir)
        if cached is not None:
            record = cached.model_copy(update={"uri": source})
            commit(options.dest, staging_dir, record)
            finish(options.dest)
            return Fetched(record, reused=False, cache=CacheOutcome.HIT)
    progress = Progress(emit)
    ctx = FetchContext(
        options=options,
        staging=Staging(staging_dir),
        budget=ByteBudget(options.max_bytes, "the model"),
        progress=progress,
        resume_dir=resume_dir,
    )
    try:
        record = _fetch_record(uri, source, ctx)
        commit(options.dest, staging_dir, record)
    except OSError as exc:
        abandon(options.dest)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise FetchFailed(
                Reason.MODEL_TOO_LARGE, f"no space left on {options.dest} for {uri}"
            ) from exc
        raise
    except BaseException:
        abandon(options.dest)
        raise
    finish(options.dest)
    progress.finish()
    if options.cache_dir is None:
        return Fetched(record, reused=False)
    return Fetched(record, reused=False, cache=publish(options.cache_dir, options.dest, record))


def _fetch_record(uri: ModelUri, source: str, ctx: FetchContext) -> InstallRecord:
    identity = _fetch_files(uri, ctx)
    entries = ctx.staging.entries()
    if not entries:
        raise FetchFailed(Reason.MODEL_NOT_FOUND, f"{uri} holds no files")
    if len(entries) > ctx.options.max_files:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE,
            f"{uri} holds {len(entries)} files, more than {ctx.options.max_files} (--max-files)",
        )
    tree = tree_digest(entries)
    digest = identity or tree
    if ctx.options.digest is not None and digest != ctx.options.digest:
        raise FetchFailed(
            Reason.DIGEST_MISMATCH,
            f"{uri} has the digest {digest}, not the {ctx.options.digest} --digest names",
        )
    return InstallRecord.of(source, digest, tree, entries)


def _fetch_files(uri: ModelUri, ctx: FetchContext) -> Digest | None:
    """Stage the files of `uri`; the digest its store pins, or None (then the tree's)."""
    if isinstance(uri, HttpsUri):
        from fleetserve_runtime.storage.https import fetch_https

        return fetch_https(uri, ctx)
    if isinstance(uri, OciUri):
        from fleetserve_runtime.storage.oci import fetch_oci

        return fetch_oci(uri, ctx)
    if isinstance(uri, S3Uri):
        from fleetserve_runtime.storage.s3 import fetch_s3

        fetch_s3(uri, ctx)
        return None
    from fleetserve_runtime.storage.hf import fetch_hf

    fetch_hf(uri, ctx)
    return None


def _pins(uri: ModelUri, digest: Digest | None) -> list[Digest]:
    """The digests an install must have: the URI's own pin and `--digest`, which must agree."""
    pinned = uri.digest if isinstance(uri, OciUri) else None
    if isinstance(uri, HttpsUri):
        pinned = uri.sha256
    if pinned is not None and digest is not None and pinned != digest:
        raise FetchFailed(Reason.DIGEST_MISMATCH, f"--digest {digest} is not the digest {uri} pins")
    return [d for d in (pinned, digest) if d is not None]
