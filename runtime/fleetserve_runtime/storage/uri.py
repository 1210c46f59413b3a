"""Model URIs the storage initializer fetches, parsed and checked before anything is fetched.

- `s3://bucket/prefix`: every object under `prefix/` (or the one object `prefix`).
- `oci://registry[:port]/repository[:tag]@sha256:<hex>`: an OCI artifact, pinned by its
  manifest digest (a tag alone is refused: one version must be one set of bytes; a tag
  beside the digest is only a label).
- `https://host/path/file`: one file, or a `.tar`, `.tar.gz`, `.tgz` or `.zip` archive
  unpacked, pinned by the SHA-256 of the file fetched: `--digest sha256:<hex>`, or the URI's
  fragment `#sha256=<hex>`. `http://` only with `allow_http`.
- `hf://org/name@revision`: a Hugging Face model repository at a revision (a branch, a tag
  or, to pin it, a commit hash).

Credentials never come from a URI: user-info (`user:pass@`) is refused. Each refusal is an
`InvalidUri` failure naming the part at fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import unquote, urlsplit

from fleetserve_runtime.storage.digests import Digest
from fleetserve_runtime.storage.reasons import FetchFailed, Reason

__all__ = ["HfUri", "HttpsUri", "ModelUri", "OciUri", "S3Uri", "parse_uri"]

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_HOST = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:.]+\]"
)
_PORT = re.compile(r"(?::[0-9]{1,5})?")
_REPOSITORY_PART = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_REPOSITORY_PART}(?:/{_REPOSITORY_PART})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_HF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_HF_REVISION = re.compile(r"[A-Za-z0-9._/-]{1,255}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEMES = "s3://, oci://, https:// or hf://"


@dataclass(frozen=True)
class S3Uri:
    """Objects of an S3 bucket under a prefix (no leading or trailing slash; "" is all)."""

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


@dataclass(frozen=True)
class OciUri:
    """An OCI artifact in `registry` (host[:port]), pinned by its manifest `digest`."""

    registry: str
    repository: str
    tag: str | None
    digest: Digest

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        return f"oci://{self.registry}/{self.repository}{tag}@{self.digest}"


@dataclass(frozen=True)
class HttpsUri:
    """One file over HTTPS (`url`, without the fragment), pinned by its SHA-256."""

    url: str
    sha256: Digest
    filename: str
    """The last part of the URL's path, unquoted: the file's name, or the archive's."""

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True)
class HfUri:
    """A Hugging Face model repository (`org/name`) at a revision."""

    repo_id: str
    revision: str

    def __str__(self) -> str:
        return f"hf://{self.repo_id}@{self.revision}"


ModelUri = S3Uri | OciUri | HttpsUri | HfUri


def parse_uri(text: str, *, allow_http: bool = False, digest: Digest | None = None) -> ModelUri:
    """The URI `text` names; an `InvalidUri` failure naming the part at fault otherwise.

    `digest` (`--digest`) is an `https://` URI's SHA-256 when its fragment gives none.
    """
    if _CONTROL.search(text) or text != text.strip():
        _refuse(text, "holds white space or a control character")
    scheme, sep, _ = text.partition("://")
    if not sep:
        _refuse(text, f"has no scheme: use {_SCHEMES}")
    scheme = scheme.lower()
    if scheme == "s3":
        return _parse_s3(text)
    if scheme == "oci":
        return _parse_oci(text)
    if scheme == "https" or (scheme == "http" and allow_http):
        return _parse_https(text, digest)
    if scheme == "http":
        _refuse(text, "is plain http, which is refused unless --allow-http is given")
    if scheme == "hf":
        return _parse_hf(text)
    return _refuse(text, f"has the scheme {scheme!r}: use {_SCHEMES}")


def _parse_s3(text: str) -> S3Uri:
    parts = urlsplit(text)
    _no_query_or_fragment(text, parts.query, parts.fragment)
    if "@" in parts.netloc:
        _refuse(text, "carries credentials: put them in the credentials directory")
    if not _BUCKET.fullmatch(parts.netloc):
        _refuse(text, f"names the bucket {parts.netloc!r}, which is not a valid bucket name")
    prefix = parts.path.strip("/")
    if "//" in prefix:
        _refuse(text, "has an empty part in its prefix ('//')")
    return S3Uri(parts.netloc, prefix)


def _parse_oci(text: str) -> OciUri:
    rest = text.partition("://")[2]
    registry, slash, reference = rest.partition("/")
    if not slash:
        _refuse(text, "names no repository: oci://registry[:port]/repository@sha256:<hex>")
    if "@" in registry:
        _refuse(text, "carries credentials: put them in a .dockerconfigjson")
    host, port = _split_port(registry)
    if not _HOST.fullmatch(host) or not _PORT.fullmatch(port):
        _refuse(text, f"names the registry {registry!r}, which is not a host[:port]")
    name, at, digest_text = reference.partition("@")
    repository, tag = _split_tag(name)
    if not _REPOSITORY.fullmatch(repository):
        _refuse(text, f"names the repository {repository!r}, which is not a valid repository")
    if tag is not None and not _TAG.fullmatch(tag):
        _refuse(text, f"names the tag {tag!r}, which is not a valid tag")
    if not at:
        _refuse(
            text, "has no digest: add @sha256:<manifest digest>, so a version is one set of bytes"
        )
    return OciUri(registry, repository, tag, _digest(text, digest_text))


def _parse_https(text: str, digest: Digest | None) -> HttpsUri:
    parts = urlsplit(text)
    if parts.username is not None or "@" in parts.netloc:
        _refuse(text, "carries credentials: put them in the credentials directory")
    if not parts.hostname:
        _refuse(text, "has no host")
    filename = unquote(parts.path.rsplit("/", 1)[-1])
    if filename in ("", ".", "..") or "/" in filename or _CONTROL.search(filename):
        _refuse(text, "does not end in a file name")
    url = text.partition("#")[0]
    if parts.fragment:
        if not parts.fragment.startswith("sha256="):
            _refuse(text, "has a fragment other than #sha256=<hex>")
        return HttpsUri(url, _digest(text, f"sha256:{parts.fragment[7:]}"), filename)
    if digest is None:
        _refuse(text, "has no sha256: give --digest sha256:<hex> (or end it in #sha256=<hex>)")
    return HttpsUri(url, digest, filename)


def _parse_hf(text: str) -> HfUri:
    rest = text.partition("://")[2]
    if "?" in rest or "#" in rest:
        _refuse(text, "has a query or a fragment")
    repo_id, at, revision = rest.partition("@")
    names = repo_id.split("/")
    if len(names) != 2 or not all(_HF_NAME.fullmatch(n) for n in names):
        _refuse(text, f"names the repository {repo_id!r}: use hf://org/name@revision")
    if any("--" in n or ".." in n for n in names):
        _refuse(text, f"names the repository {repo_id!r}, which holds '--' or '..'")
    if not at or not revision:
        _refuse(text, "has no revision: add @<commit hash, tag or branch>")
    if not _HF_REVISION.fullmatch(revision) or ".." in revision or revision.startswith("/"):
        _refuse(text, f"names the revision {revision!r}, which is not a valid revision")
    return HfUri(repo_id, revision)


def _split_port(registry: str) -> tuple[str, str]:
    if registry.startswith("["):
        host, _, port = registry.partition("]")
        return host + "]", port
    host, colon, port = registry.partition(":")
    return host, colon + port


def _split_tag(name: str) -> tuple[str, str | None]:
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return name, None
    repository, _, tag = name.rpartition(":")
    return repository, tag


def _digest(text: str, digest_text: str) -> Digest:
    try:
        return Digest.parse(digest_text)
    except ValueError:
        return _refuse(text, f"has the digest {digest_text!r}: use sha256:<64 lowercase hex>")


def _no_query_or_fragment(text: str, query: str, fragment: str) -> None:
    if query or fragment:
        _refuse(text, "has a query or a fragment")


def _refuse(text: str, problem: str) -> NoReturn:
    raise FetchFailed(Reason.INVALID_URI, f"the model URI {text!r} {problem}")
