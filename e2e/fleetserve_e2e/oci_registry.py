"""A real OCI registry on loopback: CNCF Distribution with TLS and htpasswd authentication.

Distribution's ``registry`` command serves the OCI distribution API on 127.0.0.1 (a free
port, its only listener: no debug server, no tracing exporter), over HTTPS with a certificate
signed by the CA it is given, storing blobs in a temporary directory. Every request needs
HTTP basic authentication with the one user of its htpasswd file (bcrypt, as Distribution
requires); the password is random per start.

Clients authenticate with basic auth directly, as against any htpasswd registry: oras-py, for
one, needs ``auth_backend="basic"`` (its default expects a token service).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import httpx

from fleetserve_e2e.lifecycle import Component, WorkDir, started
from fleetserve_e2e.pki import LocalCa, TlsFiles, issue_loopback_cert
from fleetserve_e2e.ports import free_port
from fleetserve_e2e.processes import MARKER_ENV, ManagedProcess, start_process
from fleetserve_e2e.storage_tools import ensure_registry
from fleetserve_e2e.waiting import wait_until

USERNAME = "fleetserve"
REALM = "fleetserve-e2e"
DOCKER_CONFIG_SECRET_TYPE = "kubernetes.io/dockerconfigjson"
_START_TIMEOUT_S = 60.0

REGISTRY_SERVER_NAME = "distribution-registry"
"""The name in the server's certificate (beside localhost and 127.0.0.1), by which a
container reaches it (`LocalCluster(host_names=...)`)."""


@dataclass(frozen=True)
class OciRegistry:
    """What a test needs to reach a running registry.

    Attributes:
        host: ``127.0.0.1:<port>``, the registry part of a reference.
        url: ``https://127.0.0.1:<port>``.
        ca_cert: The PEM CA that signed the server's certificate.
        username: The one user.
        password: Its password.
    """

    host: str
    url: str
    ca_cert: Path
    username: str
    password: str

    def reference(self, repository: str, tag_or_digest: str) -> str:
        """``<host>/<repository>:<tag>``, or ``<host>/<repository>@<digest>`` for a digest."""
        separator = "@" if ":" in tag_or_digest else ":"
        return f"{self.host}/{repository}{separator}{tag_or_digest}"

    def docker_config(self, *, password: str | None = None) -> dict[str, Any]:
        """The ``config.json`` document (a ``.dockerconfigjson`` value) for this registry.

        ``password`` replaces the real one, to test a refused login.
        """
        secret = self.password if password is None else password
        auth = base64.b64encode(f"{self.username}:{secret}".encode()).decode()
        entry = {"username": self.username, "password": secret, "auth": auth}
        return {"auths": {self.host: entry}}

    def write_docker_config(self, path: Path, *, password: str | None = None) -> Path:
        """Write :meth:`docker_config` to ``path`` (e.g. ``<dir>/config.json``) and return it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.docker_config(password=password)), encoding="utf-8")
        return path

    def pull_secret(self, name: str, namespace: str) -> dict[str, Any]:
        """A ``kubernetes.io/dockerconfigjson`` Secret manifest holding :meth:`docker_config`."""
        encoded = base64.b64encode(json.dumps(self.docker_config()).encode()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": DOCKER_CONFIG_SECRET_TYPE,
            "data": {".dockerconfigjson": encoded},
        }


def htpasswd_line(username: str, password: str) -> str:
    """One htpasswd entry with a bcrypt hash, the only kind Distribution accepts.

    The cost is bcrypt's least: the registry checks the hash on every request (a push is a
    dozen), and at the default cost that is a quarter of a second of CPU each; the password
    is random and lives as long as one test session.
    """
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    return f"{username}:{hashed}\n"


def registry_config(
    *, port: int, root: Path, tls: TlsFiles, htpasswd: Path, secret: str
) -> dict[str, Any]:
    """Distribution's configuration (JSON is valid YAML, so it is written as JSON)."""
    return {
        "version": "0.1",
        "log": {"level": "info", "formatter": "text"},
        "storage": {"filesystem": {"rootdirectory": str(root)}, "delete": {"enabled": True}},
        "http": {
            "addr": f"127.0.0.1:{port}",
            # Signs upload state between requests; a fixed random one, as with several replicas.
            "secret": secret,
            "tls": {"certificate": str(tls.cert), "key": str(tls.key)},
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
        "auth": {"htpasswd": {"realm": REALM, "path": str(htpasswd)}},
    }


class LocalOciRegistry(Component):
    """Context manager running Distribution's registry; stopped on exit.

    Args:
        ca: The CA that signs the server's certificate.
        work_dir: Storage, config, certificate and log; a temp dir removed on exit when None.
        port: The loopback port; None for any free one.
    """

    def __init__(
        self, ca: LocalCa, *, work_dir: Path | None = None, port: int | None = None
    ) -> None:
        """Configure; nothing starts before ``__enter__``."""
        self._port = port
        self._ca = ca
        self._work_dir = WorkDir(work_dir, prefix="fleetserve-registry-")
        self.process: ManagedProcess | None = None
        self._registry: OciRegistry | None = None

    @property
    def registry(self) -> OciRegistry:
        """The running registry's address, CA and credentials.

        Raises:
            RuntimeError: The registry has not started.
        """
        return started(self._registry, "the registry")

    def _start(self) -> None:
        binary = ensure_registry()
        work_dir = self._work_dir.make()
        tls = issue_loopback_cert(self._ca, work_dir / "tls", REGISTRY_SERVER_NAME)
        port = self._port or free_port()
        registry = OciRegistry(
            host=f"127.0.0.1:{port}",
            url=f"https://127.0.0.1:{port}",
            ca_cert=self._ca.cert,
            username=USERNAME,
            password=secrets.token_urlsafe(18),
        )
        htpasswd = work_dir / "htpasswd"
        htpasswd.write_text(htpasswd_line(registry.username, registry.password), encoding="utf-8")
        config = work_dir / "config.yml"
        document = registry_config(
            port=port,
            root=work_dir / "storage",
            tls=tls,
            htpasswd=htpasswd,
            secret=secrets.token_hex(16),
        )
        config.write_text(json.dumps(document, indent=2), encoding="utf-8")
        # Distribution's tracing would export spans to an OTLP collector on localhost.
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", MARKER_ENV: str(work_dir)}
        self.process = start_process(
            "registry",
            [str(binary), "serve", str(config)],
            log_path=work_dir / "registry.log",
            env=env,
            cwd=work_dir,
        )
        self._registry = registry
        trusting = ssl.create_default_context(cafile=str(registry.ca_cert))
        wait_until(
            lambda: self._is_ready(trusting),
            timeout_s=_START_TIMEOUT_S,
            what="the registry's /v2/",
        )

    def _is_ready(self, context: ssl.SSLContext) -> bool:
        if self.process is not None:
            self.process.ensure_running()
        registry = self.registry
        response = httpx.get(
            f"{registry.url}/v2/",
            auth=(registry.username, registry.password),
            verify=context,
            timeout=2.0,
            trust_env=False,
        )
        return response.status_code == httpx.codes.OK

    def close(self) -> None:
        """Stop the registry and remove an owned work dir (idempotent)."""
        if self.process is not None:
            self.process.stop()
        self._work_dir.remove()
