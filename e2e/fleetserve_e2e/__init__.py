"""Fleetserve's local control plane for e2e tests and the demo.

It builds real Kubernetes binaries from pinned Go modules, starts etcd, kube-apiserver,
kube-controller-manager and kube-scheduler on 127.0.0.1, registers fake nodes, runs scheduled
runtime and operator pods as local processes and starts a real Prometheus that scrapes the
runtime pods.  The pytest fixtures in ``e2e/conftest.py`` and the ``make cluster-up`` family
of targets are its callers.  The e2e tests' shared helpers live here too, importable under
``--import-mode=importlib``: ``testing``, ``operator_testing`` and ``rollout_testing``, and the
operator fixtures (``operator_fixtures``, a pytest plugin that ``e2e/conftest.py`` registers).
"""

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.kubeapi import KubeApiError, KubeClient
from fleetserve_e2e.pod_map import PodAddress, read_pod_map
from fleetserve_e2e.prometheus import LocalPrometheus

__all__ = [
    "KubeApiError",
    "KubeClient",
    "LocalCluster",
    "LocalPrometheus",
    "PodAddress",
    "read_pod_map",
]
