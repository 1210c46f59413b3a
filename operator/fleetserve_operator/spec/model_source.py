"""Where a model's files come from when they are not in the image (`spec.model.storage`).

Object storage, an OCI registry, an HTTPS server or a Hugging Face repository.

Such a model is fetched by the pod's init container (`fleetserve-runtime fetch`) into a volume
the runtime mounts read-only; the rules here are what the API server checks before any of that
runs: each scheme's grammar, a digest where a URI alone does not pin the bytes, and options that
apply to one scheme refused on the others.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from fleetserve_operator.spec.base import DnsSubdomain, Wire

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FETCHED_SCHEMES",
    "MODEL_URI_PATTERN",
    "SHA256_DIGEST",
    "MetadataKey",
    "ModelCache",
    "ModelStorage",
    "S3Addressing",
    "fetched_scheme",
]

FETCHED_SCHEMES = ("s3", "oci", "https", "http", "hf")
"""URI schemes whose files the init container fetches (`http` only with `allowHttp`)."""
DEFAULT_MAX_BYTES = 64 * 2**30
"""What a fetched model may hold when `spec.model.maxBytes` is unset: 64 GiB."""
SHA256_DIGEST = r"^sha256:[0-9a-f]{64}$"

_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
# A host (name or IPv4, optional port); no user-info: credentials never go in a URI.
_HOST = r"[A-Za-z0-9.-]+(:[0-9]{1,5})?"
_OCI_REPO = r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
_OCI_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_HF_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
MODEL_URI_PATTERN = (
    r"^(builtin://[a-z0-9-]+([?].*)?"
    r"|file:///.+"
    r"|pvc://[a-z0-9][a-z0-9.-]{0,252}/.+"
    rf"|s3://{_BUCKET}(/[^?#]*)?"
    rf"|oci://{_HOST}/{_OCI_REPO}(:{_OCI_TAG})?(@sha256:[0-9a-f]{{64}})?"
    rf"|https?://{_HOST}/[^?#@]+"
    rf"|hf://{_HF_NAME}/{_HF_NAME}(@[A-Za-z0-9_.-]{{1,255}})?)$"
)
"""The grammar of every model URI. `spec.model`'s rules then ask an `oci://` reference for
its manifest digest and an `hf://` one for a 40-hex commit, with a message that says so."""

S3Addressing = Literal["path", "virtual"]


class ModelCache(StrEnum):
    """Where a fetched model is kept for the next pod (`spec.model.cache`)."""

    NODE = "node"
    """The node's cache directory (a hostPath), keyed by the pinned digest."""


"""How a bucket is named in S3 requests: in the path (most self-hosted stores) or in the host
name (AWS's default)."""

MetadataKey = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", max_length=63)
]
"""A `spec.model.metadata` key: label-key grammar without a prefix."""


def fetched_scheme(uri: str | None) -> str | None:
    """The scheme of a URI the init container fetches (`FETCHED_SCHEMES`); None otherwise."""
    if uri is None:
        return None
    scheme, separator, _ = uri.partition("://")
    return scheme if separator and scheme in FETCHED_SCHEMES else None


class ModelStorage(Wire):
    """How to reach the store a fetched model lives in."""

    secret_name: DnsSubdomain | None = None
    """A Secret in the service's namespace with the credentials, mounted only into the
    fetch container: for `s3://`, keys `accessKeyId` and `secretAccessKey` (or
    `webIdentityToken` and `roleArn`); for `oci://`, a `kubernetes.io/dockerconfigjson`
    Secret; for `hf://` and `https://`, key `token` (sent as a bearer token)."""
    ca_config_map: DnsSubdomain | None = None
    """A ConfigMap whose key `ca.crt` holds the CA bundle that signs the store's TLS
    certificate (a private store); unset: the image's system CAs."""
    endpoint: str | None = Field(None, pattern=rf"^https?://{_HOST}/?$", max_length=256)
    """`s3://`: the S3 endpoint, e.g. `https://objects.example.internal:8333`; unset: AWS S3.
    `hf://`: a Hugging Face Hub mirror serving the Hub's API; unset: the Hub itself."""
    region: str | None = Field(None, pattern=r"^[a-z0-9-]+$", max_length=32)
    """`s3://` only: the bucket's region."""
    addressing: S3Addressing | None = None
    """`s3://` only: `path` or `virtual`-host bucket addressing; unset: virtual for AWS,
    path for a custom endpoint."""
    allow_http: bool = False
    """Fetch over plain HTTP (an `http://` model URI or S3 endpoint). Off by default: a
    model fetched in the clear can be swapped on the way."""
