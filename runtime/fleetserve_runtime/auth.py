"""Access control decisions: bearer tokens and the allowlist of loadable model URIs.

The functions here are pure; `TokenFile` is the one adapter. It reads the token from a file
(a mounted Secret) and reads it again whenever the file changes, so a rotated Secret takes
effect without a restart. Nothing here knows about HTTP: `api` passes header values in and
maps the answers to statuses.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["TokenFile", "bearer_token", "read_token", "token_matches", "uri_refusal"]

log = logging.getLogger("fleetserve.auth")

SERIALIZED_SUFFIXES = (".pt2", ".pt")
"""`file://` models with these suffixes are weights (torch.export / TorchScript); any other
`file://` target may be a handler directory, whose `handler.py` the loader executes."""


def read_token(path: Path) -> bytes:
    """The token in `path`, without surrounding whitespace; `ValueError` when it is empty."""
    token = path.read_bytes().strip()
    if not token:
        msg = f"token file {path} is empty"
        raise ValueError(msg)
    return token


def bearer_token(authorization: str | None) -> bytes | None:
    """The credentials of an `Authorization: Bearer <token>` header value, else None."""
    if authorization is None:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() != "bearer" or not credentials:
        return None
    return credentials.encode("utf-8", "surrogateescape")


def token_matches(presented: bytes | None, expected: bytes | None) -> bool:
    """True when both tokens exist and are equal, compared in constant time."""
    if presented is None or expected is None:
        return False
    return hmac.compare_digest(presented, expected)


class TokenFile:
    """A bearer token kept in a file, re-read whenever the file's identity or contents change.

    Kubernetes updates a mounted Secret by swapping a symlink to a new file, so the inode, size
    or modification time changes; `current` notices on the next request. An unreadable or
    empty file yields None, which matches no token: access fails closed, never open.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature: tuple[int, int, int, int] | None = None
        self._token: bytes | None = None

    def current(self) -> bytes | None:
        """The token as the file holds it now; None when the file is missing or empty."""
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            if self._signature is not None or self._token is not None:
                log.error("token file unreadable; refusing every request", extra={"why": str(exc)})
            self._signature, self._token = None, None
            return None
        signature = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns)
        if signature != self._signature:
            self._signature = signature
            try:
                self._token = read_token(self.path)
            except (OSError, ValueError) as exc:
                log.error("token file unusable; refusing every request", extra={"why": str(exc)})
                self._token = None
            else:
                log.info("token file read", extra={"path": str(self.path)})
        return self._token


def _runs_code(uri: str) -> bool:
    """Whether loading `uri` executes code it names: `module:factory` or a handler directory."""
    if "://" not in uri:
        return ":" in uri
    parsed = urlparse(uri)
    return parsed.scheme == "file" and not parsed.path.endswith(SERIALIZED_SUFFIXES)


def _pattern_matches(uri: str, pattern: str) -> bool:
    """Whether `uri` matches `pattern`: a `*` glob, else a prefix that ends at a separator.

    `*` matches any run of characters. The prefix `file:///models/enc` allows
    `file:///models/enc/v2` and `file:///models/enc?x=1`, but not `file:///models/enc-evil`.
    """
    if "*" in pattern:
        regex = ".*".join(re.escape(part) for part in pattern.split("*"))
        return re.fullmatch(regex, uri, flags=re.DOTALL) is not None
    if not uri.startswith(pattern):
        return False
    rest = uri[len(pattern) :]
    return not rest or pattern.endswith(("/", "?")) or rest[0] in "/?#"


def uri_refusal(
    uri: str, allowed: Sequence[str], *, is_directory: Callable[[str], bool]
) -> str | None:
    """Why `uri` may not be loaded through model control, or None when `allowed` permits it.

    URIs that run code (`module:factory`, `file://` handler directories) need an entry equal
    to the URI itself: no glob or prefix ever admits them. `is_directory(path)` tells whether
    a `file://` path is a directory, so a directory named like weights cannot pass as them.
    """
    if "://" in uri:
        parsed = urlparse(uri)
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            return f"model URI {uri!r} must name an absolute path (file:///...)"
        if any(segment in (".", "..") for segment in parsed.path.split("/")):
            return f"model URI {uri!r} must not contain '.' or '..' path segments"
    if _runs_code(uri):
        if uri in allowed:
            return None
        return (
            f"model URI {uri!r} runs code (module:factory or a handler directory); "
            "only an allowed_model_uris entry equal to it allows it"
        )
    if not any(_pattern_matches(uri, pattern) for pattern in allowed):
        return f"model URI {uri!r} does not match allowed_model_uris"
    if uri.startswith("file:") and is_directory(urlparse(uri).path):
        return f"model URI {uri!r} names a directory; only an exact entry allows handler code"
    return None
