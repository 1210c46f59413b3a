"""Distribution's registry, driven by oras-py: push and pull an artifact, basic auth, TLS."""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from pathlib import Path

import httpx
import oras.client
import pytest

from fleetserve_e2e.listeners import listening_addresses
from fleetserve_e2e.oci_registry import DOCKER_CONFIG_SECRET_TYPE, LocalOciRegistry, OciRegistry

FILES = {"config.json": b'{"hidden_size": 8}', "model.safetensors": bytes(range(256)) * 64}


def _client(registry: OciRegistry) -> oras.client.OrasClient:
    # Distribution's htpasswd mode challenges for basic auth; oras-py's default backend
    # expects a token service instead.
    return oras.client.OrasClient(tls_verify=str(registry.ca_cert), auth_backend="basic")


def _artifact(directory: Path) -> list[str]:
    directory.mkdir()
    for name, content in FILES.items():
        (directory / name).write_bytes(content)
    return [str(directory / name) for name in FILES]


def _pulled(paths: list[str]) -> dict[str, bytes]:
    return {Path(path).name: Path(path).read_bytes() for path in paths}


def test_push_then_pull_by_tag_and_by_digest(oci_registry: OciRegistry, tmp_path: Path) -> None:
    """Two files pushed under a tag come back byte for byte by the tag and by the digest."""
    config = oci_registry.write_docker_config(tmp_path / "docker" / "config.json")
    repository = f"models/tiny-{uuid.uuid4().hex[:8]}"
    tagged = oci_registry.reference(repository, "v1")

    pushed = _client(oci_registry).push(
        target=tagged,
        files=_artifact(tmp_path / "artifact"),
        config_path=str(config),
        disable_path_validation=True,
    )
    digest = pushed.headers["Docker-Content-Digest"]

    by_tag = _client(oci_registry).pull(
        target=tagged, config_path=str(config), outdir=str(tmp_path / "by-tag")
    )
    by_digest = _client(oci_registry).pull(
        target=oci_registry.reference(repository, digest),
        config_path=str(config),
        outdir=str(tmp_path / "by-digest"),
    )
    assert digest.startswith("sha256:")
    assert _pulled(by_tag) == FILES
    assert _pulled(by_digest) == FILES


def test_wrong_password_is_refused(oci_registry: OciRegistry, tmp_path: Path) -> None:
    """A config.json with the wrong password can neither push nor pull."""
    wrong = oci_registry.write_docker_config(tmp_path / "config.json", password="not-it")
    target = oci_registry.reference(f"models/refused-{uuid.uuid4().hex[:8]}", "v1")

    with pytest.raises(ValueError, match="(?i)unauthorized"):
        _client(oci_registry).push(
            target=target,
            files=_artifact(tmp_path / "artifact"),
            config_path=str(wrong),
            disable_path_validation=True,
        )
    with pytest.raises(ValueError, match="(?i)unauthorized"):
        _client(oci_registry).pull(
            target=target, config_path=str(wrong), outdir=str(tmp_path / "out")
        )


def test_anonymous_request_is_challenged(oci_registry: OciRegistry) -> None:
    """Without credentials /v2/ answers 401 with a basic challenge; with them, 200."""
    context = ssl.create_default_context(cafile=str(oci_registry.ca_cert))

    anonymous = httpx.get(f"{oci_registry.url}/v2/", verify=context, timeout=10.0)
    credentials = (oci_registry.username, oci_registry.password)
    signed_in = httpx.get(f"{oci_registry.url}/v2/", auth=credentials, verify=context, timeout=10.0)

    assert anonymous.status_code == httpx.codes.UNAUTHORIZED
    assert anonymous.headers["WWW-Authenticate"].startswith("Basic ")
    assert signed_in.status_code == httpx.codes.OK


def test_server_certificate_is_verified(oci_registry: OciRegistry) -> None:
    """A client that trusts only the system CAs refuses the server."""
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{oci_registry.url}/v2/", timeout=10.0)


def test_pull_secret_holds_the_docker_config(oci_registry: OciRegistry) -> None:
    """The Secret manifest carries the same config.json, under `.dockerconfigjson`."""
    secret = oci_registry.pull_secret("registry-credentials", "models")

    decoded = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    entry = decoded["auths"][oci_registry.host]
    assert secret["type"] == DOCKER_CONFIG_SECRET_TYPE
    assert decoded == oci_registry.docker_config()
    assert base64.b64decode(entry["auth"]).decode() == (
        f"{oci_registry.username}:{oci_registry.password}"
    )


def test_registry_listens_on_loopback_only(oci_registry_server: LocalOciRegistry) -> None:
    """The registry's one listener is on 127.0.0.1."""
    assert oci_registry_server.process is not None
    addresses = listening_addresses(oci_registry_server.process.pid)
    assert {host for host, _port in addresses} == {"127.0.0.1"}
