"""The images travel through an OCI registry as a cluster's nodes get them."""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path

import httpx
import pytest

from fleetserve_e2e.images.build import Built
from fleetserve_e2e.images.catalog import OPERATOR, RUNTIME_GPU
from fleetserve_e2e.images.podman import PodmanError, podman
from fleetserve_e2e.images.registry import push, registry_access, remote_reference
from fleetserve_e2e.oci_registry import OciRegistry

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    )
)


def manifest(registry: OciRegistry, reference: str) -> httpx.Response:
    """GET the manifest of ``reference`` (``host/repository@digest``) with the credentials."""
    name, digest = reference.removeprefix(f"{registry.host}/").split("@")
    return httpx.get(
        f"{registry.url}/v2/{name}/manifests/{digest}",
        auth=(registry.username, registry.password),
        headers={"Accept": MANIFEST_TYPES},
        verify=ssl.create_default_context(cafile=str(registry.ca_cert)),
        timeout=30,
        trust_env=False,
    )


def test_both_images_are_pushed_and_served_by_digest(
    images: dict[str, Built], image_registry: OciRegistry
) -> None:
    """The registry serves each pushed manifest under the digest the push reported."""
    for name in (OPERATOR, RUNTIME_GPU):
        reference = push(images[name].spec.tag, image_registry)
        response = manifest(image_registry, reference)
        assert response.status_code == 200, response.text
        assert response.headers["Docker-Content-Digest"] == reference.split("@")[1]
        assert len(response.json()["layers"]) >= 2, name


def test_a_node_with_an_empty_store_pulls_the_operator_by_digest(
    images: dict[str, Built], image_registry: OciRegistry
) -> None:
    """A separate podman store (a fresh node) pulls the image and gets the same config."""
    reference = push(images[OPERATOR].spec.tag, image_registry)
    local_id = podman(["image", "inspect", "--format", "{{.Id}}", images[OPERATOR].spec.tag])
    with (
        tempfile.TemporaryDirectory(prefix="fleetserve-node-") as node,
        registry_access(image_registry) as access,
    ):
        store = ["--root", str(Path(node) / "root"), "--runroot", str(Path(node) / "run")]
        podman([*store, *access.argv(reference)])
        pulled = podman([*store, "image", "inspect", "--format", "{{.Id}}", reference])
        podman([*store, "rmi", "--all", "--force"])
    assert pulled.stdout.strip() == local_id.stdout.strip()


def test_a_push_with_a_wrong_password_is_refused(
    images: dict[str, Built], image_registry: OciRegistry
) -> None:
    """Nothing reaches what the nodes pull without the registry's credentials."""
    local = images[OPERATOR].spec.tag
    target = remote_reference(image_registry, local) + "-unauthorized"
    with (
        registry_access(image_registry, password="not-" + image_registry.password) as access,
        pytest.raises(PodmanError, match="(?i)unauthorized|authentication required"),
    ):
        podman(["push", *access.options(), local, target])
