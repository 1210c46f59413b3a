"""A child's create is create-only on the real API server, and its first apply takes it over.

`KubeApi.create` POSTs the child: the API server refuses it where an object of that name is
stored, whatever that object holds, and leaves that object as it was; the create's dry-run
answers the same. The POST makes the operator the `Update` owner of every field it set; the
first apply onto the child makes that entry its `Apply` entry first, so a field the operator
stops rendering is removed and the defaults the API server set stay. The reconcile finds a
taken name before it writes (`test_children.py`); the conflict here is what still holds when
another client creates the name between that check and the write. Run as the operator's
ServiceAccount, under its shipped RBAC, with no operator running.
"""

from __future__ import annotations

import copy
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

NAME = "ownership"


def _operator_api(kubeconfig: Path) -> KubeApi:
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped
        config_file=str(kubeconfig), client_configuration=configuration
    )
    return KubeApi(kubernetes.client.ApiClient(configuration), timeout_s=10.0)


def _children(kube: KubeClient, namespace: str) -> list[Manifest]:
    """The InferenceService's children as the operator renders them.

    The InferenceService is created first, so the garbage collector leaves its children alone.
    """
    service = kube.create(fsvc_path(namespace), synthetic_service(NAME))
    meta = service["metadata"]
    owner = Owner(name=NAME, namespace=namespace, uid=meta["uid"])
    spec = InferenceServiceSpec.model_validate(service["spec"])
    return desired_children(owner, spec, InferenceServiceStatus())


def _umbrella_service(kube: KubeClient, namespace: str) -> Manifest:
    children = _children(kube, namespace)
    return next(c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == NAME)


def _entries(obj: Manifest) -> list[tuple[str, str]]:
    return [(e["manager"], e["operation"]) for e in obj["metadata"]["managedFields"]]


def test_a_create_makes_the_operator_the_owner_of_what_it_set(
    kube: KubeClient, namespace: str, operator_kubeconfig: Path
) -> None:
    """A POST: the operator is the `Update` owner of the fields it set, and no one else."""
    manifest = _umbrella_service(kube, namespace)
    created = _operator_api(operator_kubeconfig).create(manifest)
    stored = kube.get(child_path("Service", namespace, NAME))
    assert stored["metadata"]["uid"] == created["metadata"]["uid"]
    assert _entries(stored) == [(MANAGER, "Update")]
    assert stored["spec"]["ports"] == manifest["spec"]["ports"]


def test_the_first_apply_removes_what_the_operator_stopped_rendering_and_keeps_defaults(
    kube: KubeClient, namespace: str, operator_kubeconfig: Path
) -> None:
    """An env entry created and no longer rendered is gone; the API server's defaults stay.

    Without the take-over the create's `Update` entry would keep that entry forever.
    """
    api = _operator_api(operator_kubeconfig)
    rendered = next(c for c in _children(kube, namespace) if c["kind"] == "Deployment")
    older = copy.deepcopy(rendered)
    (container, *_) = older["spec"]["template"]["spec"]["containers"]
    container["env"] = [*container.get("env", []), {"name": "DROPPED", "value": "1"}]
    created = api.create(older)
    path = child_path("Deployment", namespace, rendered["metadata"]["name"])
    defaults = {k: created["spec"][k] for k in ("strategy", "revisionHistoryLimit")}
    api.apply(rendered, current=kube.get(path))
    stored = kube.get(path)
    (container, *_) = stored["spec"]["template"]["spec"]["containers"]
    assert "DROPPED" not in {env["name"] for env in container.get("env", [])}
    assert {k: stored["spec"][k] for k in defaults} == defaults
    assert stored["metadata"]["generation"] == created["metadata"]["generation"] + 1
    assert (MANAGER, "Update") not in _entries(stored)
    assert (MANAGER, "Apply") in _entries(stored)


@pytest.mark.parametrize("same_content", [False, True], ids=["other-content", "same-content"])
def test_a_create_onto_a_stored_name_is_refused_and_leaves_it_as_it_was(
    kube: KubeClient, namespace: str, operator_kubeconfig: Path, same_content: bool
) -> None:
    """Someone else's object is never written, even one holding what the operator renders.

    An apply would share such an object's fields and own them.
    """
    manifest = _umbrella_service(kube, namespace)
    theirs = {"metadata": {"name": NAME}, "spec": {"ports": [{"port": 443}]}}
    if same_content:
        theirs = {k: v for k, v in manifest.items() if k in ("metadata", "spec")}
    before = kube.create(child_path("Service", namespace), theirs)
    with pytest.raises(ChildConflict):
        _operator_api(operator_kubeconfig).validate(manifest, current=None)
    with pytest.raises(ChildConflict):
        _operator_api(operator_kubeconfig).create(manifest)
    after = kube.get(child_path("Service", namespace, NAME))
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert MANAGER not in {e["manager"] for e in after["metadata"]["managedFields"]}
