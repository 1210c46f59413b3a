"""Reach an OCI registry as a cluster's nodes do: push the built images, pull what is missing.

The registry is any that speaks the OCI distribution API over TLS (in e2e, CNCF Distribution
on loopback with a CA of its own, ``fleetserve_e2e.oci_registry``); podman trusts that CA
through a certificates directory given per command, never the host's trust store, and logs in
with the registry's basic credentials per command, never in a stored login.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fleetserve_e2e.images.podman import podman
from fleetserve_e2e.oci_registry import OciRegistry


@dataclass(frozen=True)
class PullOptions:
    """How podman reaches a registry: a directory holding its CA, and its credentials."""

    cert_dir: Path | None = None
    credentials: str | None = None
    """``user:password`` for the registry."""

    @classmethod
    def for_registry(
        cls, registry: OciRegistry, cert_dir: Path, *, password: str | None = None
    ) -> PullOptions:
        """Trust ``registry``'s CA (copied into ``cert_dir``) and log in as its user.

        ``password`` replaces the real one, to test a refused push.
        """
        cert_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(registry.ca_cert, cert_dir / "ca.crt")
        secret = registry.password if password is None else password
        return cls(cert_dir=cert_dir, credentials=f"{registry.username}:{secret}")

    def options(self) -> list[str]:
        """The registry options of ``podman pull`` and ``podman push``."""
        args = [] if self.cert_dir is None else ["--cert-dir", str(self.cert_dir)]
        return args if self.credentials is None else [*args, "--creds", self.credentials]

    def argv(self, ref: str) -> list[str]:
        """``podman pull`` arguments for `ref`."""
        return ["pull", "--quiet", *self.options(), ref]


@contextmanager
def registry_access(registry: OciRegistry, *, password: str | None = None) -> Iterator[PullOptions]:
    """`PullOptions.for_registry` with a certificates directory that lasts the block."""
    with tempfile.TemporaryDirectory(prefix="fleetserve-certs-") as certs:
        yield PullOptions.for_registry(registry, Path(certs), password=password)


def remote_reference(registry: OciRegistry, local_tag: str) -> str:
    """Where ``local_tag`` (``localhost/<repository>:<tag>``) lives in ``registry``."""
    name = local_tag.removeprefix("localhost/")
    repository, _, tag = name.rpartition(":")
    return registry.reference(repository, tag)


def push(local_tag: str, registry: OciRegistry) -> str:
    """Push ``local_tag`` to ``registry``; return the pushed reference pinned by its digest."""
    reference = remote_reference(registry, local_tag)
    with tempfile.TemporaryDirectory(prefix="fleetserve-push-") as work:
        digest_file = Path(work) / "digest"
        with registry_access(registry) as access:
            podman(
                ["push", *access.options(), "--digestfile", str(digest_file), local_tag, reference],
                timeout_s=1800,
            )
        digest = digest_file.read_text(encoding="utf-8").strip()
    repository = reference.rsplit(":", 1)[0]
    return f"{repository}@{digest}"
