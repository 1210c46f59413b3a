"""Write the admin kubeconfig that kubectl, helm, the operator and the harness all use.

It is written as JSON, which every kubeconfig reader accepts (JSON is YAML), and it refers to
the certificate files by absolute path instead of embedding them.
"""

from __future__ import annotations

import json
from pathlib import Path

from fleetserve_e2e.pki import ClusterPki

CONTEXT = "fleetserve-e2e"


def write_kubeconfig(path: Path, *, server: str, pki: ClusterPki) -> Path:
    """Write an admin kubeconfig for ``server`` to ``path`` and return the path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": CONTEXT,
                "user": {
                    "client-certificate": str(pki.admin_cert),
                    "client-key": str(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT}}],
        "current-context": CONTEXT,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path
