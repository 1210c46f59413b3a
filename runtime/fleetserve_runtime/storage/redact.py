"""What no message of the storage initializer may carry: credentials and signed URL queries.

Every value read from a credentials file is remembered here, and `clean` takes each of them
out of a text, with URL query strings (a presigned URL's signature is a credential) and URL
user-info. Messages are also cut to `MAX_MESSAGE_CHARS`: they end up in a pod's status, and
Kubernetes keeps at most 4096 bytes of a termination message.
"""

from __future__ import annotations

import re
import threading

__all__ = ["MAX_MESSAGE_CHARS", "clean", "remember_secret", "scrub"]

MAX_MESSAGE_CHARS = 512
"""Longest message, in characters, after redaction."""

_MIN_SECRET_CHARS = 4
"""Shorter values (an empty file, a one-letter user name) would blank ordinary words."""

_QUERY = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"]*)\?[^\s#'\"]*")
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/@'\"]+@")

_secrets: set[str] = set()
_lock = threading.Lock()


def remember_secret(value: str) -> None:
    """Never let `value` appear in a message from now on (this process)."""
    if len(value) >= _MIN_SECRET_CHARS:
        with _lock:
            _secrets.add(value)


def scrub(text: str) -> str:
    """`text` without remembered secrets, URL queries or URL user-info."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, "***")
    return _USERINFO.sub(r"\1***@", _QUERY.sub(r"\1?***", text))


def clean(text: str) -> str:
    """`scrub(text)`, cut to at most `MAX_MESSAGE_CHARS`: a message fit for a pod's status."""
    text = scrub(text)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1] + "…"
    return text
