"""Traefik as a real Gateway API data plane in front of a local cluster's pods.

Traefik's Kubernetes Gateway provider watches the cluster's GatewayClasses, Gateways,
HTTPRoutes, Services and EndpointSlices through the API server and routes each request by the
HTTPRoute's backend weights to a ready endpoint of the chosen Service, so the canary split the
operator writes is enforced by a gateway rather than by the load driver.  The pods must be
reachable at the addresses their Services' EndpointSlices name: run the cluster with
``pod_network=True`` (``pod_endpoints``).

The build (``make gateway-tools``) follows ``storage_tools``: the unmodified upstream command
from the module pinned by ``e2e/gateway-tools/``, cached under
``~/.cache/fleetserve/bin/traefik-<version>/``.  Traefik's dependency graph does not build from
the module proxy alone, so each build first writes a go.mod of its own
(:func:`prepare_traefik_build`); ``e2e/gateway-tools/go.mod`` says what differs and why.

:class:`LocalTraefik` runs it as a local process listening on 127.0.0.1 only (its traffic
entry point and its ping endpoint), reading the cluster through the admin kubeconfig, with
version checks and usage reports off, since nothing outside this machine is reachable.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.identity import isolated_env
from fleetserve_e2e.kubeapi import JsonObject, KubeApiError, KubeClient, namespaced
from fleetserve_e2e.lifecycle import Component
from fleetserve_e2e.paths import E2E_DIR, cache_dir
from fleetserve_e2e.ports import free_ports
from fleetserve_e2e.processes import ManagedProcess, start_process
from fleetserve_e2e.storage_tools import GoCommand, ensure_command
from fleetserve_e2e.waiting import wait_until

GATEWAY_TOOLS_DIR = E2E_DIR / "gateway-tools"
PATCH_DIR = GATEWAY_TOOLS_DIR / "_patches"
"""Files the build puts into copies of two modules; `_` keeps the go command out of it."""
TRAEFIK_MODULE = "github.com/traefik/traefik/v3"
LEGO_MODULE = "github.com/go-acme/lego/v5"
HTTP_AUTH_MODULE = "github.com/abbot/go-http-auth"
EXT_MODULE = "github.com/traefik/traefik/dynamic/ext"
CONTROLLER_NAME = "traefik.io/gateway-controller"
"""The controllerName a GatewayClass names for Traefik to take its Gateways."""
GATEWAY_CLASS = "traefik"
GATEWAY_API = "gateway.networking.k8s.io/v1"
LISTENER = "web"


def _writable_copy(source: Path, target: Path) -> Path:
    """Copy a module from Go's read-only module cache to `target`, writable."""
    shutil.copytree(source, target)
    for root, dirs, files in os.walk(target):
        for name in [*dirs, *files]:
            path = Path(root, name)
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    target.chmod(target.stat().st_mode | stat.S_IWUSR)
    return target


def _module_source(module: str) -> Path:
    """The directory of `module` (or of its replacement) as the gateway tools module pins it."""
    subprocess.run(["go", "mod", "download", module], cwd=GATEWAY_TOOLS_DIR, check=True)
    listed = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", module],
        cwd=GATEWAY_TOOLS_DIR,
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(listed.stdout.strip())


def prepare_traefik_build(command: GoCommand) -> Path:
    """Write the go.mod Traefik is built with, beside the two modules it patches; return it.

    The module proxy refuses a dozen of the DNS-challenge providers' SDK modules that lego's
    provider registry imports, and the fork of go-http-auth Traefik's go.mod substitutes.  The
    build therefore gets, in ``~/.cache/fleetserve/build/traefik-<version>/``, a copy of lego
    whose registry is ``_patches/lego_dns_providers.go`` and a copy of go-http-auth v0.4.0 with
    ``_patches/go_http_auth.go`` added, and a go.mod that replaces the two modules with those
    copies (Go refuses to overlay files inside its module cache).
    """
    build_dir = cache_dir() / "build" / f"{command.label}-{command.version()}"
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(parents=True)
    lego = _writable_copy(_module_source(LEGO_MODULE), build_dir / "lego")
    registry = lego / "providers" / "dns" / "zz_gen_dns_providers.go"
    shutil.copyfile(PATCH_DIR / "lego_dns_providers.go", registry)
    http_auth = _writable_copy(_module_source(HTTP_AUTH_MODULE), build_dir / "go-http-auth")
    # v0.4.0 predates modules; a directory replacement needs a go.mod.
    (http_auth / "go.mod").write_text(f"module {HTTP_AUTH_MODULE}\n\ngo 1.12\n", encoding="utf-8")
    shutil.copyfile(PATCH_DIR / "go_http_auth.go", http_auth / "fleetserve_e2e.go")
    modfile = build_dir / "go.mod"
    shutil.copyfile(GATEWAY_TOOLS_DIR / "go.mod", modfile)
    shutil.copyfile(GATEWAY_TOOLS_DIR / "go.sum", build_dir / "go.sum")
    replacements = {
        EXT_MODULE: GATEWAY_TOOLS_DIR / "ext",
        LEGO_MODULE: lego,
        HTTP_AUTH_MODULE: http_auth,
    }
    subprocess.run(
        [
            "go",
            "mod",
            "edit",
            f"-modfile={modfile}",
            *(f"-replace={module}={path}" for module, path in replacements.items()),
        ],
        cwd=GATEWAY_TOOLS_DIR,
        check=True,
    )
    return modfile


TRAEFIK = GoCommand(
    label="traefik",
    binary_name="traefik",
    module=TRAEFIK_MODULE,
    package=f"{TRAEFIK_MODULE}/cmd/traefik",
    tools_module=GATEWAY_TOOLS_DIR,
    stamp=lambda version: f"-X {TRAEFIK_MODULE}/pkg/version.Version={version}",
    prepare=prepare_traefik_build,
)


def ensure_traefik() -> Path:
    """Return Traefik's binary, building it when missing (about 12 minutes on 2 busy cores)."""
    return ensure_command(TRAEFIK)


def build_gateway_tools() -> Path:
    """Build Traefik if missing (``make gateway-tools``) and return its binary."""
    binary = ensure_traefik()
    print(f"gateway-tools: {binary}", flush=True)
    return binary


def gateway_class() -> JsonObject:
    """The GatewayClass whose Gateways Traefik serves."""
    return {
        "apiVersion": GATEWAY_API,
        "kind": "GatewayClass",
        "metadata": {"name": GATEWAY_CLASS},
        "spec": {"controllerName": CONTROLLER_NAME},
    }


def gateway(name: str, port: int) -> JsonObject:
    """A Gateway of one HTTP listener on Traefik's entry point `port`, for routes beside it.

    Traefik binds a listener to the entry point whose address ends in the listener's port.
    """
    listener = {
        "name": LISTENER,
        "protocol": "HTTP",
        "port": port,
        "allowedRoutes": {"namespaces": {"from": "Same"}},
    }
    return {
        "apiVersion": GATEWAY_API,
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": {"gatewayClassName": GATEWAY_CLASS, "listeners": [listener]},
    }


def create_gateway_class(kube: KubeClient) -> None:
    """Create Traefik's GatewayClass unless it exists."""
    try:
        kube.create(f"/apis/{GATEWAY_API}/gatewayclasses", gateway_class())
    except KubeApiError as error:
        if error.status_code != 409:
            raise


def create_gateway(kube: KubeClient, namespace: str, name: str, port: int) -> JsonObject:
    """Create a Gateway on Traefik's entry point in `namespace`; return it."""
    path = namespaced("gateways", namespace, group_version=GATEWAY_API)
    return kube.create(path, gateway(name, port))


def is_programmed(kube: KubeClient, namespace: str, name: str) -> bool:
    """Whether Traefik reports the Gateway's `Programmed` condition True."""
    path = namespaced("gateways", namespace, name, group_version=GATEWAY_API)
    conditions = kube.get(path).get("status", {}).get("conditions", [])
    return any(c["type"] == "Programmed" and c["status"] == "True" for c in conditions)


@dataclass(eq=False)
class LocalTraefik(Component):
    """Traefik on 127.0.0.1, serving the Gateways of its class in `cluster`.

    Nothing starts before ``__enter__``.

    Attributes:
        cluster: The cluster whose Gateway API objects Traefik reads (admin kubeconfig).
        log_path: Where Traefik's log goes.
        binary: The Traefik command; :func:`ensure_traefik` when None.
        start_timeout_s: How long Traefik may take to answer its ping endpoint.
        port: The traffic entry point's port, which a Gateway's listener names.
        ping_port: The port of Traefik's API and ping endpoint.
        process: Traefik, once started.
    """

    cluster: LocalCluster
    log_path: Path
    _: KW_ONLY
    binary: Path | None = None
    start_timeout_s: float = 60.0
    port: int = field(default=0, init=False)
    ping_port: int = field(default=0, init=False)
    process: ManagedProcess | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """Base URL of the traffic entry point."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """Base URL of Traefik's API and ping endpoint."""
        return f"http://127.0.0.1:{self.ping_port}"

    def argv(self, binary: Path) -> list[str]:
        """Traefik's static configuration, as flags."""
        return [
            str(binary),
            f"--entryPoints.{LISTENER}.address=127.0.0.1:{self.port}",
            f"--entryPoints.traefik.address=127.0.0.1:{self.ping_port}",
            "--ping=true",
            "--ping.entryPoint=traefik",
            # The API (read-only, on the loopback-only `traefik` entry point) shows the routers
            # and weighted services Traefik built: a test waits there for a route's weights.
            "--api=true",
            "--api.insecure=true",
            "--providers.kubernetesGateway=true",
            # Every route or endpoint change is applied as it comes, not batched.
            "--providers.kubernetesGateway.throttleDuration=0s",
            "--global.checkNewVersion=false",
            "--global.sendAnonymousUsage=false",
            "--log.level=INFO",
        ]

    def _start(self) -> None:
        binary = self.binary or ensure_traefik()
        self.port, self.ping_port = free_ports(2)
        env = {**isolated_env(os.environ), "KUBECONFIG": str(self.cluster.kubeconfig)}
        process = start_process("traefik", self.argv(binary), log_path=self.log_path, env=env)
        self.process = process
        ping = f"{self.api_url}/ping"
        wait_until(
            lambda: process.answers(ping), timeout_s=self.start_timeout_s, what=f"Traefik {ping}"
        )

    def close(self) -> None:
        """Stop Traefik (idempotent)."""
        if self.process is not None:
            self.process.stop()
            self.process = None
