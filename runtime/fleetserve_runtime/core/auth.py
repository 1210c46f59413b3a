"""Access control decisions: bearer tokens and the allowlist of loadable model URIs.

The functions here are pure (but `is_privileged`, which asks a `TokenFile`); `TokenFile` is
the one adapter. It reads the token from a file (a mounted Secret) and reads it again
whenever the file changes, so a rotated Secret takes effect without a restart. Nothing here
knows about HTTP or gRPC: the edge (`server`) passes header and metadata values in and maps
the answers to statuses.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlparse

__all__ = [
    "MIN_TOKEN_BYTES",
    "TokenFile",
    "allowlist_entry_problem",
    "bearer_token",
    "is_privileged",
    "read_token",
    "token_matches",
    "uri_refusal",
]

log = logging.getLogger("fleetserve.auth")

SERIALIZED_SUFFIXES = (".pt2", ".pt")
"""`file://` models with these suffixes are weights (torch.export / TorchScript); any other
`file://` target may be a handler directory, whose `handler.py` the loader executes."""


MIN_TOKEN_BYTES = 16
"""Shortest token a token file may hold: shorter ones are guessable by brute force."""


def read_token(path: Path) -> bytes:
    """The token in `path`, without surrounding whitespace.

    `ValueError` when it is empty or shorter than `MIN_TOKEN_BYTES`.
    """
    token = path.read_bytes().strip()
    if not token:
        msg = f"token file {path} is empty"
        raise ValueError(msg)
    if len(token) < MIN_TOKEN_BYTES:
        msg = (
            f"token file {path} holds a {len(token)}-byte token; tokens must be at least "
            f"{MIN_TOKEN_BYTES} bytes (e.g. the output of `openssl rand -hex 32`)"
        )
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

    Kubernetes updates a mounted Secret by swapping a symlink to a new file, so the inode, size,
    modification or change time changes; `current` notices on the next request. An
    unreadable, empty or too short file yields None, which matches no token: access fails
    closed, never open.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature: tuple[int, ...] | None = None
        self._token: bytes | None = None

    def current(self) -> bytes | None:
        """The token as the file holds it now; None when the file is missing or unusable."""
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            if self._signature is not None or self._token is not None:
                log.error("token file unreadable; refusing every request", extra={"why": str(exc)})
            self._signature, self._token = None, None
            return None
        signature = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
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


def is_privileged(presented: bytes | None, priority_token: TokenFile | None) -> bool:
    """Whether `presented` (bearer credentials) is the priority token (`priority_token_file`).

    The one check both edges, HTTP and gRPC, make before granting more than the defaults
    (`serving.admission`); never true on a server without a priority token.
    """
    return priority_token is not None and token_matches(presented, priority_token.current())


@dataclass(frozen=True, slots=True)
class _Uri:
    """A model URI cut into the parts the loader reads, as the loader reads them."""

    scheme: str
    host: str
    path: str
    query: dict[str, str]


def _split(uri: str) -> _Uri:
    """The parts of `uri`; `ValueError` for what the loader could read more than one way.

    Repeated query keys are refused (the loader would keep only the last), and so is a
    `#fragment` (the loader ignores it).
    """
    try:
        parsed = urlparse(uri)
    except ValueError as exc:
        msg = f"it is not a valid URI ({exc})"
        raise ValueError(msg) from None
    pairs = parse_qsl(parsed.query, keep_blank_values=True)
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        msg = f"query parameter {repeated[0]!r} appears more than once"
        raise ValueError(msg)
    if parsed.fragment:
        msg = "a '#fragment' is not allowed"
        raise ValueError(msg)
    return _Uri(parsed.scheme, parsed.netloc, parsed.path, dict(pairs))


def allowlist_entry_problem(entry: str) -> str | None:
    """What is wrong with an `allowed_model_uris` entry, or None; for start-up checks."""
    try:
        _split(entry)
    except ValueError as exc:
        return f"allowed_model_uris entry {entry!r}: {exc}"
    return None


def _glob(pattern: str, star: str) -> str:
    """`pattern` as a regex where each `*` is `star` and everything else is literal."""
    return star.join(re.escape(part) for part in pattern.split("*"))


def _path_matches(path: str, pattern: str) -> bool:
    """Whether `path` is `pattern` or lies below it; `*` matches within one path segment."""
    regex = _glob(pattern.rstrip("/"), "[^/]*") + "(?:/.*)?"
    return re.fullmatch(regex, path, flags=re.DOTALL) is not None


def _real_pattern(pattern: str, real_path: Callable[[str], str]) -> str:
    """`pattern` with its leading segments before the first `*` resolved by `real_path`."""
    segments = pattern.split("/")
    fixed = next((n for n, segment in enumerate(segments) if "*" in segment), len(segments))
    head = "/".join(segments[:fixed])
    if not head:
        return pattern
    return "/".join([real_path(head).rstrip("/"), *segments[fixed:]])


def _entry_admits(uri: _Uri, entry: str, real_path: Callable[[str], str]) -> bool:
    """Whether allowlist `entry` admits `uri` (which runs no code); see `uri_refusal`."""
    if entry == "*":
        return True
    if "://" not in entry:
        return False
    allowed = _split(entry)
    if not (
        re.fullmatch(_glob(allowed.scheme, "[^/]*"), uri.scheme)
        and re.fullmatch(_glob(allowed.host or "*", "[^/]*"), uri.host)
        and _path_matches(uri.path, allowed.path)
    ):
        return False
    if allowed.query and (
        uri.query.keys() != allowed.query.keys()
        or not all(
            re.fullmatch(_glob(value, ".*"), uri.query[key], flags=re.DOTALL)
            for key, value in allowed.query.items()
        )
    ):
        return False
    if uri.scheme == "file":
        return _path_matches(real_path(uri.path), _real_pattern(allowed.path, real_path))
    return True


def _runs_code(uri: str) -> bool:
    """Whether loading `uri` executes code it names: `module:factory` or a handler directory."""
    if "://" not in uri:
        return ":" in uri
    parsed = urlparse(uri)
    return parsed.scheme == "file" and not parsed.path.endswith(SERIALIZED_SUFFIXES)


def uri_refusal(
    uri: str,
    allowed: Sequence[str],
    *,
    is_directory: Callable[[str], bool],
    real_path: Callable[[str], str],
) -> str | None:
    """Why `uri` may not be loaded through model control, or None when `allowed` permits it.

    URIs that run code (`module:factory`, `file://` handler directories) need an entry equal
    to the URI itself: no glob or prefix ever admits them. Any other URI needs an entry

    - `*`, which admits every URI that runs no code; or
    - `scheme://host/path?query` whose scheme and host match the URI's (an empty host, as in
      `builtin://`, matches any); whose path is the URI's path or a directory above it
      (`file:///models/enc` admits `file:///models/enc` and `file:///models/enc/v2.pt2`,
      not `file:///models/enc-evil.pt2`); and, if the entry has a query, whose query has
      the same parameters as the URI's with equal values, in any order (an entry without a
      query admits any query). In each part `*` matches any run of characters, within one
      segment in scheme, host and path.

    URIs that repeat a query parameter or carry a `#fragment` are refused: the loader would
    read them differently from this check. A `file://` path must also match after
    `real_path` (`os.path.realpath`) resolves symlinks in it and in the entry, so a link
    inside an allowed directory cannot point outside it. `is_directory(path)` tells whether
    a `file://` path is a directory, so a directory named like weights cannot pass as them.
    """
    try:
        parts = _split(uri)
    except ValueError as exc:
        return f"model URI {uri!r} is refused: {exc}"
    if "://" in uri:
        if parts.scheme == "file" and parts.host not in ("", "localhost"):
            return f"model URI {uri!r} must name an absolute path (file:///...)"
        if any(segment in (".", "..") for segment in parts.path.split("/")):
            return f"model URI {uri!r} must not contain '.' or '..' path segments"
    if _runs_code(uri):
        if uri in allowed:
            return None
        return (
            f"model URI {uri!r} runs code (module:factory or a handler directory); "
            "only an allowed_model_uris entry equal to it allows it"
        )
    if not any(_entry_admits(parts, entry, real_path) for entry in allowed):
        return f"model URI {uri!r} does not match allowed_model_uris"
    if parts.scheme == "file" and is_directory(parts.path):
        return f"model URI {uri!r} names a directory; only an exact entry allows handler code"
    return None
