"""The built helm, run against a local cluster with its config and cache in a directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.paths import binary


def helm(
    cluster: LocalCluster, home: Path, *args: str, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run the built helm against ``cluster``, with its config and cache kept in ``home``."""
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(  # the built helm, our own arguments
        [str(binary("helm")), *args],
        env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
