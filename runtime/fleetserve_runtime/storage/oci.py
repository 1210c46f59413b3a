"""`oci://registry/repository[:tag]@sha256:<hex>` URIs: an OCI artifact, pulled by digest.

The manifest is fetched by its digest and its bytes must hash to it (else DigestMismatch); an
image index is refused (the URI must name one manifest). Every layer must carry the title
annotation `oras push` writes (`org.opencontainers.image.title`), its path in the model, and
the layers' declared sizes are checked against the budget and `--max-files` before any blob
is read. A layer `oras push` made of a directory (a gzip'd tar holding the directory, which
the oras CLI annotates `io.deis.oras.content.unpack` and oras-py types
`application/vnd.oci.image.layer.v1.tar+gzip`) is unpacked at the model's root as `archive`
unpacks; any other layer is the file at its title. Each blob must have its declared size
and digest, else DigestMismatch.

Through oras' registry client: its requests session and its token authentication (a Bearer
challenge answered with a token from the registry's realm). Not through its `pull`, which
retries every failure five times over minutes and unpacks with tarfile's `extractall`.
Logins come from the credentials directory's `.dockerconfigjson`; a Basic challenge is
answered with the login directly, a Bearer challenge through a token request made with it.
401 and 403: AccessDenied; 404: ModelNotFound; other statuses, a refused, failed or timed-out
connection, a TLS failure, a body cut short: StorageUnreachable.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import oras.provider  # type: ignore[import-untyped]
import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from requests.adapters import HTTPAdapter

from fleetserve_runtime.storage.archive import ArchiveKind, unpack
from fleetserve_runtime.storage.budget import ByteBudget, metered
from fleetserve_runtime.storage.context import FetchContext
from fleetserve_runtime.storage.credentials import registry_login
from fleetserve_runtime.storage.digests import Digest
from fleetserve_runtime.storage.options import FetchOptions
from fleetserve_runtime.storage.reasons import FetchFailed, Reason, for_status
from fleetserve_runtime.storage.staging import CHUNK_BYTES
from fleetserve_runtime.storage.tls import ca_bundle
from fleetserve_runtime.storage.uri import OciUri

__all__ = ["fetch_oci"]

_MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_MAX_MANIFEST_BYTES = 4 << 20
"""The largest manifest read (the registries' own limit)."""
_TITLE = "org.opencontainers.image.title"
_UNPACK = "io.deis.oras.content.unpack"
_DIRECTORY_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


class _Layer(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    media_type: str = Field(alias="mediaType")
    digest: str
    size: int = Field(ge=0)
    annotations: dict[str, str] = {}


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    media_type: str | None = Field(default=None, alias="mediaType")
    layers: list[_Layer] = []
    manifests: list[dict[str, Any]] | None = None


def fetch_oci(uri: OciUri, ctx: FetchContext) -> Digest:
    """Pull the artifact `uri` pins into the staging directory; its digest is the manifest's."""
    registry = _Registry(uri.registry, ctx.options)
    manifest = _manifest(registry, uri)
    titles = [_title(layer, uri) for layer in manifest.layers]
    if len(titles) > ctx.options.max_files:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE,
            f"{uri} has {len(titles)} layers, more than {ctx.options.max_files} (--max-files)",
        )
    declared = sum(layer.size for layer in manifest.layers)
    ctx.budget.check_declared(declared, f"{uri} (its manifest's layers)")
    ctx.progress.start(declared)
    download = ByteBudget(ctx.options.max_bytes, "the download")
    for layer, title in zip(manifest.layers, titles, strict=True):
        chunks = _blob(registry, uri, layer, download, ctx)
        if layer.annotations.get(_UNPACK) != "true" and layer.media_type != _DIRECTORY_TYPE:
            ctx.staging.write(title, chunks)
            continue
        tarball = ctx.resume_dir / f"layer-{_layer_digest(layer, uri).hex}.tar.gz"
        with tarball.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
        try:
            unpack(tarball, ArchiveKind.TAR, ctx.staging, ctx.budget, ctx.options.max_files)
        finally:
            tarball.unlink()
    return uri.digest


def _manifest(registry: _Registry, uri: OciUri) -> _Manifest:
    url = f"{registry.base}/{uri.repository}/manifests/{uri.digest}"
    with _mapped_errors(str(uri)), registry.get(url, accept=_MANIFEST_TYPES + _INDEX_TYPES) as got:
        if got.status_code != 200:
            raise for_status(got.status_code, f"{uri} (its manifest)")
        body = b""
        for chunk in got.iter_content(CHUNK_BYTES):
            body += chunk
            if len(body) > _MAX_MANIFEST_BYTES:
                raise FetchFailed(
                    Reason.INVALID_ARCHIVE,
                    f"{uri}: the manifest passes {_MAX_MANIFEST_BYTES} bytes",
                )
    actual = hashlib.sha256(body).hexdigest()
    if actual != uri.digest.hex:
        raise FetchFailed(
            Reason.DIGEST_MISMATCH, f"{uri}: the registry sent a manifest of digest sha256:{actual}"
        )
    try:
        manifest = _Manifest.model_validate_json(body)
    except ValidationError as exc:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE, f"{uri}: not an OCI manifest ({exc.error_count()} errors)"
        ) from None
    if manifest.manifests is not None or manifest.media_type in _INDEX_TYPES:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE,
            f"{uri} is an image index: name one of its manifests by its digest",
        )
    return manifest


def _title(layer: _Layer, uri: OciUri) -> str:
    title = layer.annotations.get(_TITLE)
    if not title:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE,
            f"{uri}: the layer {layer.digest} has no {_TITLE} annotation to name its file",
        )
    return title


def _layer_digest(layer: _Layer, uri: OciUri) -> Digest:
    try:
        return Digest.parse(layer.digest)
    except ValueError:
        raise FetchFailed(
            Reason.INVALID_ARCHIVE, f"{uri}: the layer digest {layer.digest!r} is not sha256"
        ) from None


def _blob(
    registry: _Registry, uri: OciUri, layer: _Layer, budget: ByteBudget, ctx: FetchContext
) -> Iterator[bytes]:
    """The blob of `layer`, checked against its declared size and digest as it streams."""
    digest = _layer_digest(layer, uri)
    where = f"{uri} (the layer {digest})"
    url = f"{registry.base}/{uri.repository}/blobs/{digest}"
    hasher = hashlib.sha256()
    size = 0
    with _mapped_errors(where), registry.get(url, stream=True) as got:
        if got.status_code != 200:
            raise for_status(got.status_code, where)
        for chunk in metered(got.iter_content(CHUNK_BYTES), budget, ctx.progress):
            size += len(chunk)
            if size > layer.size:
                break
            hasher.update(chunk)
            yield chunk
    if size != layer.size or hasher.hexdigest() != digest.hex:
        raise FetchFailed(
            Reason.DIGEST_MISMATCH,
            f"{where}: the registry sent {size}{'+' if size > layer.size else ''} bytes of "
            f"digest sha256:{hasher.hexdigest()}, the manifest declares {layer.size}",
        )


class _Registry:
    """HTTP to one registry: oras' session and token auth, a bounded wait, no retries."""

    def __init__(self, host: str, options: FetchOptions) -> None:
        self.base = f"https://{host}/v2"
        # Given with every request: a session's own `verify` loses to REQUESTS_CA_BUNDLE.
        self._bundle = ca_bundle(options.ca_file)
        self._oras = oras.provider.Registry(hostname=host, tls_verify=self._bundle)
        session: requests.Session = self._oras.session
        adapter = _BoundedAdapter((options.connect_timeout_s, options.read_timeout_s))
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        login = registry_login(options.credentials_dir, host)
        self._basic: str | None = None
        if login is not None:
            self._oras.auth.set_basic_auth(*login)
            self._basic = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
        self._authorization: str | None = None

    def get(
        self, url: str, *, accept: tuple[str, ...] = (), stream: bool = False
    ) -> requests.Response:
        """GET `url`, answering one 401 challenge (the answer is kept for later requests)."""
        headers = {"Accept": ", ".join(accept)} if accept else {}
        if self._authorization is not None:
            headers["Authorization"] = self._authorization
        session: requests.Session = self._oras.session
        got = session.get(url, headers=headers, stream=stream, verify=self._bundle)
        if got.status_code != 401:
            return got
        authorization = self._answer(got)
        if authorization is None:
            return got
        got.close()
        self._authorization = headers["Authorization"] = authorization
        return session.get(url, headers=headers, stream=stream, verify=self._bundle)

    def _answer(self, challenged: requests.Response) -> str | None:
        challenge = challenged.headers.get("WWW-Authenticate", "")
        if challenge.lower().startswith("basic"):
            return f"Basic {self._basic}" if self._basic else None
        answered, changed = self._oras.auth.authenticate_request(challenged, {})
        authorization = answered.get("Authorization") if changed else None
        return authorization if isinstance(authorization, str) else None


class _BoundedAdapter(HTTPAdapter):
    """Every request of the session (oras' token requests too) with a timeout, no retry."""

    def __init__(self, timeout: tuple[float, float]) -> None:
        super().__init__(max_retries=0)
        self._timeout = timeout

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        """Send with the session's timeout unless the caller gave one."""
        return super().send(
            request,
            stream=stream,
            timeout=timeout or self._timeout,
            verify=verify,
            cert=cert,
            proxies=proxies,
        )


@contextmanager
def _mapped_errors(what: str) -> Iterator[None]:
    """Errors of requests as StorageUnreachable, fetching `what`."""
    try:
        yield
    except requests.Timeout as exc:
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE, f"{what}: {type(exc).__name__}: no answer in time"
        ) from exc
    except requests.RequestException as exc:
        raise FetchFailed(
            Reason.STORAGE_UNREACHABLE, f"{what}: {type(exc).__name__}: {exc}"
        ) from exc
