"""What a fetch is told besides the URI: destination, pins, limits, trust and store settings.

The command line (`command`) builds these from its flags; the defaults here are its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fleetserve_runtime.storage.digests import Digest

__all__ = ["FetchOptions", "HfSettings", "S3Settings"]

S3Addressing = Literal["auto", "path", "virtual"]


@dataclass(frozen=True)
class S3Settings:
    """Where an S3-compatible store is and how to address and authenticate to it."""

    endpoint: str = "https://s3.amazonaws.com"
    """Endpoint URL; `http://` only with `allow_http`."""
    region: str | None = None
    """Signing region; None asks the store (one more request)."""
    addressing: S3Addressing = "auto"
    """`path` (`host/bucket/key`), `virtual` (`bucket.host/key`), or `auto`: virtual on AWS,
    path elsewhere."""
    web_identity_token_file: Path | None = None
    """A projected service-account token to exchange (AssumeRoleWithWebIdentity) for keys."""
    role_arn: str | None = None
    """The role the web identity token assumes."""
    sts_endpoint: str | None = None
    """STS endpoint for the web identity exchange; None: AWS's regional STS for an AWS
    endpoint, the S3 endpoint itself elsewhere."""


@dataclass(frozen=True)
class HfSettings:
    """Where a Hugging Face hub is and where its cache lives."""

    endpoint: str | None = None
    """Hub URL; None is huggingface_hub's default (or `HF_ENDPOINT`)."""
    cache_dir: Path | None = None
    """A huggingface_hub cache to read from and fill; None: a scratch cache in the volume."""
    offline: bool = False
    """Read only from `cache_dir`, with no network at all."""


@dataclass(frozen=True)
class FetchOptions:
    """Everything a fetch needs besides the URI."""

    dest: Path
    """The volume: the model lands in `dest/model`, its record in `dest/model.json`."""
    digest: Digest | None = None
    """The content digest the fetch must produce (`--digest`), else DigestMismatch."""
    max_bytes: int | None = None
    """Most bytes the model (and any archive of it) may take; None: no limit."""
    max_files: int = 100_000
    """Most files (and archive members) the model may hold."""
    ca_file: Path | None = None
    """PEM bundle to trust instead of the default roots, for every TLS connection."""
    credentials_dir: Path | None = None
    """A mounted Secret (`credentials` lists its files)."""
    allow_http: bool = False
    """Accept plain `http://` URIs and S3 endpoints."""
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    """Longest wait for the next bytes of an answer: a stalled store fails after this long."""
    parallelism: int = 4
    """Objects (S3) fetched at once."""
    cache_dir: Path | None = None
    """The node's model cache (`node_cache`); needs a pinned digest."""
    s3: S3Settings = field(default_factory=S3Settings)
    hf: HfSettings = field(default_factory=HfSettings)
