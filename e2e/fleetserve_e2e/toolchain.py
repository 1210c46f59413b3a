"""Build the control-plane binaries from the pinned Go tools module (``make tools``).

Each binary is built with the machine's Go toolchain (CGO disabled, trimmed, stripped) into
``~/.cache/fleetserve/bin/<kubernetes-version>/`` and skipped when already there, so a second
run takes about a second.  Go's own build and module caches make a rebuild after a version bump
incremental.  Progress goes to stdout because the first build takes many minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from fleetserve_e2e.paths import TOOLS_DIR, bin_dir, pinned_version

# Binary name → Go package, in the order the harness needs them (apiserver and etcd first, so a
# partial build is already useful).  etcd's server module has its `main` package at its root.
PACKAGES: dict[str, str] = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "helm": "helm.sh/helm/v3/cmd/helm",
}
GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"
KUBERNETES_MODULE = "k8s.io/kubernetes"
# Kubernetes' release scripts stamp the version into these packages; a plain `go build` leaves
# "v0.0.0-master", which /version would report and version checks (helm's kubeVersion) reject.
_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")


def ldflags(package: str) -> str:
    """Return the linker flags for ``package``: stripped, and version-stamped for kubernetes."""
    flags = ["-s", "-w"]
    if package.startswith(f"{KUBERNETES_MODULE}/"):
        version = pinned_version(KUBERNETES_MODULE)
        major, minor, _patch = version.removeprefix("v").split(".")
        stamps = {"gitVersion": version, "gitMajor": major, "gitMinor": minor}
        stamps["gitTreeState"] = "clean"
        flags += [
            f"-X {pkg}.{var}={value}" for pkg in _VERSION_PACKAGES for var, value in stamps.items()
        ]
    return " ".join(flags)


def build_binary(
    name: str,
    package: str,
    target_dir: Path,
    *,
    module: Path = TOOLS_DIR,
    flags: str | None = None,
    niceness: int = 0,
    modfile: Path | None = None,
) -> None:
    """Build one binary atomically: a half-written file must never look like a finished one.

    ``module`` is the Go module whose go.mod/go.sum pin the build; ``flags`` replaces the
    linker flags :func:`ldflags` would choose; ``niceness`` lowers the compiler's priority (a
    build a test starts must not starve the servers other tests are timing); ``modfile`` is a
    go.mod to build with instead of the module's own (``go build -modfile``; its go.sum lies
    beside it).
    """
    partial = target_dir / f".{name}.partial"
    env = {**os.environ, "CGO_ENABLED": "0"}
    linker = ldflags(package) if flags is None else flags
    nice = ["nice", "-n", str(niceness)] if niceness else []
    modfile_flag = [] if modfile is None else [f"-modfile={modfile}"]
    subprocess.run(
        [
            *nice,
            "go",
            "build",
            *modfile_flag,
            "-trimpath",
            f"-ldflags={linker}",
            "-o",
            str(partial),
            package,
        ],
        cwd=module,
        env=env,
        check=True,
    )
    partial.replace(target_dir / name)


def build_tools(target_dir: Path | None = None) -> Path:
    """Build every missing binary and return the directory that holds them."""
    target = target_dir or bin_dir()
    target.mkdir(parents=True, exist_ok=True)
    missing = {name: pkg for name, pkg in PACKAGES.items() if not (target / name).is_file()}
    if not missing:
        print(f"tools: all {len(PACKAGES)} binaries present in {target}", flush=True)
        return target
    started = time.monotonic()
    for index, (name, package) in enumerate(missing.items(), start=1):
        print(f"tools: [{index}/{len(missing)}] building {name} from {package} ...", flush=True)
        step = time.monotonic()
        build_binary(name, package, target)
        print(
            f"tools: [{index}/{len(missing)}] {name} built in {time.monotonic() - step:.0f}s",
            flush=True,
        )
    print(f"tools: built {len(missing)} binaries in {time.monotonic() - started:.0f}s", flush=True)
    return target


def module_dir(module: str, tools_module: Path = TOOLS_DIR) -> Path:
    """Return the module-cache directory of a module pinned by a tools module.

    ``go mod download -json`` fetches it when missing; the version comes from
    ``tools_module``'s go.mod.
    """
    output = subprocess.run(
        ["go", "mod", "download", "-json", module],
        cwd=tools_module,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(json.loads(output)["Dir"])


def gateway_api_crd_dir() -> Path:
    """Return the directory of the pinned Gateway API standard-channel CRD manifests."""
    return module_dir(GATEWAY_API_MODULE) / "config" / "crd" / "standard"
