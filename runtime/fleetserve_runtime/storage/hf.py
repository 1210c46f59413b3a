"""`hf://org/name@revision` URIs: a Hugging Face model repository at a revision.

huggingface_hub's `snapshot_download` fills a cache in its own layout (`--hf-cache-dir`, else
a scratch cache in the volume's resume area, which a retry continues from); the snapshot's
files are then copied into the staging directory, hashed on the way, each charged to the
budget. Online, the repository's declared file sizes (a dry run of the download) are checked
against the budget and `--max-files` before anything is downloaded. Offline (`--hf-offline`,
like HF_HUB_OFFLINE) nothing goes over the network: the snapshot must be in the cache
directory already, e.g. a pre-populated volume. Progress counts the bytes copied.

The endpoint, the token (the credentials directory's `token`; no other token is used), the
CA file and the timeouts apply to huggingface_hub's HTTP client; files the Hub keeps in Xet
storage come through hf_xet, which makes its own connections.

Errors: a repository, revision or file not found, or a snapshot missing from an offline
cache: ModelNotFound; a gated or disabled repository, 401 or 403: AccessDenied; a failed or
timed-out connection, 5xx, or a cache miss while the Hub is unreachable: StorageUnreachable.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import set_client_factory, snapshot_download
from huggingface_hub.errors import (
    DisabledRepoError,
    DryRunError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils._http import hf_request_event_hook
from huggingface_hub.utils.tqdm import disable_progress_bars

from fleetserve_runtime.storage.budget import metered
from fleetserve_runtime.storage.context import FetchContext
from fleetserve_runtime.storage.credentials import bearer_token
from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.reasons import FetchFailed, Reason, for_status
from fleetserve_runtime.storage.staging import chunks_of
from fleetserve_runtime.storage.tls import check_endpoint, http_client
from fleetserve_runtime.storage.uri import HfUri

__all__ = ["fetch_hf"]


def fetch_hf(uri: HfUri, ctx: FetchContext) -> None:
    """Fetch the repository `uri` names into the staging directory."""
    settings = ctx.options.hf
    if settings.endpoint is not None:
        check_endpoint(settings.endpoint, allow_http=ctx.options.allow_http, flag="--hf-endpoint")
    disable_progress_bars()
    set_client_factory(functools.partial(_client, ctx.options))
    cache = settings.cache_dir or ctx.resume_dir / "hf-cache"
    where: dict[str, Any] = {
        "revision": uri.revision,
        "cache_dir": cache,
        "token": bearer_token(ctx.options.credentials_dir) or False,
        "endpoint": settings.endpoint,
    }
    with _mapped_errors(uri, offline=settings.offline):
        if not settings.offline:
            plan = snapshot_download(uri.repo_id, **where, dry_run=True)
            _check(uri, [info.file_size or 0 for info in plan], ctx)
        folder = snapshot_download(uri.repo_id, **where, local_files_only=settings.offline)
    files = _snapshot_files(Path(folder), cache, uri)
    _check(uri, [size for _, _, size in files], ctx)
    ctx.progress.start(sum(size for _, _, size in files))
    for path, source, _ in files:
        with source.open("rb") as blob:
            ctx.staging.write(path, metered(chunks_of(blob), ctx.budget, ctx.progress))


def _check(uri: HfUri, sizes: list[int], ctx: FetchContext) -> None:
    """The files' count and declared sizes against `--max-files` and the budget."""
    if len(sizes) > ctx.options.max_files:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE,
            f"{uri} holds {len(sizes)} files, more than {ctx.options.max_files} (--max-files)",
        )
    ctx.budget.check_declared(sum(sizes), f"{uri} (its files)")


def _snapshot_files(folder: Path, cache: Path, uri: HfUri) -> list[tuple[str, Path, int]]:
    """(path in the model, blob in the cache, size) of each file of the snapshot."""
    root = cache.resolve()
    files: list[tuple[str, Path, int]] = []
    for link in sorted(folder.rglob("*")):
        if link.is_dir():
            continue
        source = link.resolve()
        path = link.relative_to(folder).as_posix()
        if not source.is_relative_to(root) or not source.is_file():
            raise FetchFailed(
                Reason.INVALID_ARCHIVE,
                f"{uri}: the cached file {path!r} does not lead to a file inside the cache",
            )
        files.append((path, source, source.stat().st_size))
    return files


def _client(options: FetchOptions) -> httpx2.Client:
    # huggingface_hub's own request hook (its request ids and offline switch) stays on.
    return http_client(options, [hf_request_event_hook])


@contextmanager
def _mapped_errors(uri: HfUri, *, offline: bool) -> Iterator[None]:
    """huggingface_hub's and httpx2's errors as the failure they mean."""
    try:
        yield
    except Exception as exc:
        failure = _failure(exc, uri, offline=offline)
        if failure is None:
            raise
        raise failure from exc


def _failure(exc: BaseException | None, uri: HfUri, *, offline: bool) -> FetchFailed | None:
    refused = _own_refusal(exc)
    if refused is not None:
        return refused
    name = type(exc).__name__
    if isinstance(exc, DryRunError):
        # Raised by the dry run in place of the Hub's answer, which is its cause.
        return _failure(exc.__cause__, uri, offline=offline) or FetchFailed(
            Reason.STORAGE_UNREACHABLE, f"{uri}: the Hub cannot be reached"
        )
    if isinstance(exc, HFValidationError):
        return FetchFailed(Reason.INVALID_URI, f"{uri}: {exc}")
    if isinstance(exc, GatedRepoError | DisabledRepoError):
        return FetchFailed(Reason.ACCESS_DENIED, f"{uri}: {name}: the token gives no access")
    if isinstance(exc, RepositoryNotFoundError | RevisionNotFoundError):
        return FetchFailed(
            Reason.MODEL_NOT_FOUND, f"{uri}: {name} (or private, and the token cannot read it)"
        )
    if isinstance(exc, LocalEntryNotFoundError):
        if offline:
            return FetchFailed(Reason.MODEL_NOT_FOUND, f"{uri}: not in the cache (offline)")
        return FetchFailed(
            Reason.STORAGE_UNREACHABLE, f"{uri}: the Hub cannot be reached and it is not cached"
        )
    if isinstance(exc, HfHubHTTPError):
        return for_status(exc.response.status_code, f"{uri} ({name})")
    if isinstance(exc, OfflineModeIsEnabled | httpx2.TransportError):
        return FetchFailed(Reason.STORAGE_UNREACHABLE, f"{uri}: {name}: {exc}")
    return None


def _own_refusal(exc: BaseException | None) -> FetchFailed | None:
    """A failure the fetch's own client raised (a refused redirect), under huggingface_hub's.

    huggingface_hub turns any error of a download into its own ("cannot be reached"), with
    ours as the cause or context; ours says why.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, FetchFailed):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
