"""The TLS trust of every connection a fetch makes: `--ca-file`, or the default roots.

A CA file replaces the default roots rather than adding to them: a store inside the cluster
is trusted through its own CA only. A store that redirects to public hosts needs a bundle
holding their roots too.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpx2

from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.reasons import FetchFailed, Reason

__all__ = ["ca_bundle", "check_endpoint", "client_context", "http_client"]


def ca_bundle(ca_file: Path | None) -> str:
    """The path of the PEM bundle to trust (for clients that take a path)."""
    return str(ca_file) if ca_file is not None else certifi.where()


def client_context(ca_file: Path | None) -> ssl.SSLContext:
    """A verifying client context trusting `ca_bundle(ca_file)`."""
    try:
        return ssl.create_default_context(cafile=ca_bundle(ca_file))
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE, f"cannot load the CA file {ca_file}: {exc}"
        ) from exc


def http_client(
    options: FetchOptions, request_hooks: list[Callable[[httpx2.Request], Any]]
) -> httpx2.Client:
    """A fetch's HTTP client: `options`' trust and timeouts, redirects followed.

    `request_hooks` run on every request it sends, redirects included. A redirect to plain
    http is refused unless `options.allow_http`: it would carry the download (and, to the
    same host, its credentials) in the clear.
    """
    hooks = [*request_hooks, *([] if options.allow_http else [_refuse_plain_http])]
    return httpx2.Client(
        verify=client_context(options.ca_file),
        timeout=httpx2.Timeout(options.read_timeout_s, connect=options.connect_timeout_s),
        follow_redirects=True,
        event_hooks={"request": hooks},
    )


def _refuse_plain_http(request: httpx2.Request) -> None:
    if request.url.scheme != "https":
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE,
            f"redirected to plain http ({request.url}), which is refused unless --allow-http",
        )


def check_endpoint(url: str, *, allow_http: bool, flag: str) -> None:
    """Refuse an endpoint (`flag` names it) that is not an https URL, or http when not allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise FetchFailed(
            Reason.INVALID_URI, f"{flag} {url!r} is not a URL like https://host[:port]"
        )
    if parts.scheme == "http" and not allow_http:
        raise FetchFailed(
            Reason.INVALID_URI, f"{flag} {url} is plain http, refused unless --allow-http"
        )
