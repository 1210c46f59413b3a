"""Push the built images to an OCI registry, and pull them from it, as a cluster's nodes do.

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
from pathlib import Path

from fleetserve_e2e.images.podman import podman
from fleetserve_e2e.oci_registry import OciRegistry


@contextmanager
def trust_options(registry: OciRegistry, *, password: str | None = None) -> Iterator[list[str]]:
    """The podman options that trust ``registry``'s CA and carry its credentials.

    ``password`` replaces the real one, to test a refused push.
    """
    secret = registry.password if password is None else password
    with tempfile.TemporaryDirectory(prefix="fleetserve-certs-") as certs:
        shutil.copyfile(registry.ca_cert, Path(certs) / "ca.crt")
        yield ["--cert-dir", certs, "--creds", f"{registry.username}:{secret}"]


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
        with trust_options(registry) as options:
            podman(
                ["push", *options, "--digestfile", str(digest_file), local_tag, reference],
                timeout_s=1800,
            )
        digest = digest_file.read_text(encoding="utf-8").strip()
    repository = reference.rsplit(":", 1)[0]
    return f"{repository}@{digest}"


def pull(reference: str, registry: OciRegistry) -> None:
    """Pull ``reference`` from ``registry`` into the local store."""
    with trust_options(registry) as options:
        podman(["pull", "--quiet", *options, reference], timeout_s=1800)
