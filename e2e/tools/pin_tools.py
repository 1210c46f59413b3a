"""Regenerate the pinned Go tools module in ``e2e/tools`` (go.mod and go.sum).

Run by hand when bumping a version; ``build_tools.py`` only builds what this pins.

``k8s.io/kubernetes`` refers to its staging modules (``k8s.io/api``, ``k8s.io/client-go``, ...)
as ``v0.0.0`` with ``replace`` directives pointing into its own source tree, which a module that
depends on it cannot use.  We therefore read the replace list from the module's own go.mod, as
``go mod download -json`` leaves it in the module cache, and replace each staging module with
its published ``v0.<minor>.<patch>`` release.  ``go mod tidy`` then drops whatever the
built commands do not need.

Usage: ``python e2e/tools/pin_tools.py``
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parent
KUBERNETES_VERSION = "v1.37.2"
# The etcd minor that kubernetes' own go.mod requires, so client and server agree.
ETCD_VERSION = "v3.7.0"
HELM_VERSION = "v3.22.0"
GATEWAY_API_VERSION = "v1.6.3"
GO_VERSION = "1.26.0"

TOOLS = (
    f"k8s.io/kubernetes/cmd/kube-apiserver@{KUBERNETES_VERSION}",
    f"k8s.io/kubernetes/cmd/kube-controller-manager@{KUBERNETES_VERSION}",
    f"k8s.io/kubernetes/cmd/kube-scheduler@{KUBERNETES_VERSION}",
    f"k8s.io/kubernetes/cmd/kubectl@{KUBERNETES_VERSION}",
    f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}",
    f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}",
)
# Not a tool: the Gateway API CRD manifests are read from this module's config/ directory.
EXTRA_REQUIREMENTS = (f"sigs.k8s.io/gateway-api@{GATEWAY_API_VERSION}",)

_STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", re.MULTILINE)


def _go(*args: str) -> str:
    """Run ``go`` in the tools module and return its stdout, failing loudly."""
    print("+ go", " ".join(args), flush=True)
    return subprocess.run(
        ["go", *args], cwd=TOOLS_DIR, check=True, capture_output=True, text=True
    ).stdout


def staging_modules(version: str) -> list[str]:
    """Return the staging module paths that ``k8s.io/kubernetes@version`` replaces locally."""
    info = json.loads(_go("mod", "download", "-json", f"k8s.io/kubernetes@{version}"))
    gomod_text = Path(info["GoMod"]).read_text(encoding="utf-8")
    return sorted(_STAGING_REPLACE.findall(gomod_text))


def staging_version(kubernetes_version: str) -> str:
    """Map ``v1.37.2`` to the staging modules' tag ``v0.37.2``."""
    return "v0." + kubernetes_version.removeprefix("v1.")


def main() -> None:
    """Write go.mod from scratch, add tools and replaces, then tidy."""
    gomod = TOOLS_DIR / "go.mod"
    gomod.unlink(missing_ok=True)
    (TOOLS_DIR / "go.sum").unlink(missing_ok=True)
    _go("mod", "init", "fleetserve.local/e2e/tools")
    # `go mod init` writes the local toolchain's patch release; ask only for what kubernetes
    # itself needs, so any Go 1.26.x builds the tools.
    _go("mod", "edit", f"-go={GO_VERSION}")
    release = staging_version(KUBERNETES_VERSION)
    for module in staging_modules(KUBERNETES_VERSION):
        _go("mod", "edit", f"-replace={module}={module}@{release}")
    _go("mod", "edit", f"-require=k8s.io/kubernetes@{KUBERNETES_VERSION}")
    for tool in TOOLS:
        _go("get", "-tool", tool)
    for requirement in EXTRA_REQUIREMENTS:
        _go("get", requirement)
    _go("mod", "tidy")
    print(f"pinned {len(TOOLS)} tools in {gomod}")


if __name__ == "__main__":
    main()
