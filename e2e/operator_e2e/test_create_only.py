"""A child's create is create-only on the real API server, and one request.

`KubeApi.create` is a server-side apply that names a resourceVersion no stored object has:
the API server creates the object where none is, the operator its only `Apply` owner, and
refuses it where an object of that name is stored, whatever that object holds. The reconcile
finds a taken name before it writes (its dry-run, `test_children.py`); this is what still
holds when another client creates the name between that check and the write. Run as the
operator's ServiceAccount, under its shipped RBAC, with no operator running.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes
import pytest
from fleetserve_operator.controller.kube import KubeApi
from fleetserve_operator.errors import ChildConflict
from fleetserve_operator.records import Manifest
from fleetserve_operator.render import Owner, desired_children
from fleetserve_operator.spec import InferenceServiceSpec, InferenceServiceStatus

from fleetserve_e2e import KubeClient
from fleetserve_e2e.operator_process import MANAGER, child_path, fsvc_path
from fleetserve_e2e.operator_testing import synthetic_service

NAME = "create-only"


def _operator_api(kubeconfig: Path) -> KubeApi:
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped
        config_file=str(kubeconfig), client_configuration=configuration
    )
    return KubeApi(kubernetes.client.ApiClient(configuration), timeout_s=10.0)


def _umbrella_service(kube: KubeClient, namespace: str) -> Manifest:
    """The InferenceService's umbrella Service as the operator renders it.

    The InferenceService is created first, so the garbage collector leaves its child alone.
    """
    service = kube.create(fsvc_path(namespace), synthetic_service(NAME))
    meta = service["metadata"]
    owner = Owner(name=NAME, namespace=namespace, uid=meta["uid"])
    spec = InferenceServiceSpec.model_validate(service["spec"])
    children = desired_children(owner, spec, InferenceServiceStatus())
    return next(c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == NAME)


def test_a_create_makes_the_operator_the_only_applier(
    kube: KubeClient, namespace: str, operator_kubeconfig: Path
) -> None:
    """No `Update` entry to take over afterwards: the create needs no second request."""
    manifest = _umbrella_service(kube, namespace)
    created = _operator_api(operator_kubeconfig).create(manifest)
    stored = kube.get(child_path("Service", namespace, NAME))
    assert stored["metadata"]["uid"] == created["metadata"]["uid"]
    entries = [(e["manager"], e["operation"]) for e in stored["metadata"]["managedFields"]]
    assert entries == [(MANAGER, "Apply")]
    assert stored["spec"]["ports"] == manifest["spec"]["ports"]


@pytest.mark.parametrize("same_content", [False, True], ids=["other-content", "same-content"])
def test_a_create_onto_a_stored_name_is_refused_and_leaves_it_as_it_was(
    kube: KubeClient, namespace: str, operator_kubeconfig: Path, same_content: bool
) -> None:
    """Someone else's object is never merged into, even one holding what the operator applies.

    An apply that names no version would share such an object's fields and own them.
    """
    manifest = _umbrella_service(kube, namespace)
    theirs = {"metadata": {"name": NAME}, "spec": {"ports": [{"port": 443}]}}
    if same_content:
        theirs = {k: v for k, v in manifest.items() if k in ("metadata", "spec")}
    before = kube.create(child_path("Service", namespace), theirs)
    with pytest.raises(ChildConflict):
        _operator_api(operator_kubeconfig).create(manifest)
    after = kube.get(child_path("Service", namespace, NAME))
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert MANAGER not in {e["manager"] for e in after["metadata"]["managedFields"]}
