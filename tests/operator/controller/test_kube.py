"""`KubeApi` over real HTTP against a loopback stand-in for the API server: bounded refusals.

The stand-in (`http.server` on 127.0.0.1) answers every request with one scripted status and
a `Status` body whose message is a mebibyte long, as an admission webhook quoting the whole
object could make it. Whatever the operator turns that into (the `ChildRefused` that reaches
status, the `ClusterUnavailable` kopf keeps in its progress annotation) stays bounded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import pytest

from fleetserve_operator import naming
from fleetserve_operator.controller.kube import KubeApi, ObjectRef, as_applied
from fleetserve_operator.errors import (
    MESSAGE_LIMIT,
    ChildConflict,
    ChildRefused,
    ClusterUnavailable,
    FleetserveError,
)
from fleetserve_operator.records import EventNote
from fleetserve_operator.render import Owner, desired_children
from fleetserve_operator.spec import InferenceServiceStatus
from fleetserve_operator.testing import QuietHandler, make_spec, serve_http

MIB = 2**20
OWNER = Owner(name="demo", namespace="ns", uid="uid-demo")
REF = ObjectRef(namespace="ns", name="demo", uid="uid-demo")
FINALIZED = {"metadata": {"namespace": "ns", "name": "demo", "finalizers": ["other/x", "a/b"]}}


@dataclass
class FakeApiServer:
    """Answers every request with `status` and a long `message`; records (method, path, body)."""

    status: int = 422
    message: str = "spec.template: Invalid value: " + "x" * MIB
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer()

    class Handler(QuietHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            fake.requests.append((self.command, self.path, json.loads(body) if body else None))
            status = {"kind": "Status", "status": "Failure", "message": fake.message}
            payload = json.dumps({**status, "code": fake.status}).encode()
            self.reply(fake.status, payload, {"Content-Type": "application/json"})

        do_GET = do_POST = do_PATCH = do_DELETE = _answer  # http.server's naming

    with serve_http(Handler) as url:
        fake.url = url
        yield fake


def _kube(server: FakeApiServer) -> KubeApi:
    configuration = kubernetes.client.Configuration(host=server.url)
    return KubeApi(kubernetes.client.ApiClient(configuration), timeout_s=5.0)


def _deployment() -> dict[str, Any]:
    children = desired_children(OWNER, make_spec(), InferenceServiceStatus())
    return next(child for child in children if child["kind"] == "Deployment")


def _created(kube: KubeApi) -> None:
    kube.create(_deployment())


def _validated(kube: KubeApi) -> None:
    kube.validate(_deployment(), current=None)


def _applied(kube: KubeApi) -> None:
    current = {**_deployment(), "metadata": {**_deployment()["metadata"], "uid": "u1"}}
    kube.apply(_deployment(), current=current)


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(_validated, id="dry-run"),
        pytest.param(_created, id="create"),
        pytest.param(_applied, id="apply"),
    ],
)
def test_a_refused_child_quotes_at_most_the_limit(
    api_server: FakeApiServer, write: Callable[[KubeApi], None]
) -> None:
    """422 on any write: ChildRefused names the child and quotes the start of the refusal."""
    with pytest.raises(ChildRefused) as refused:
        write(_kube(api_server))
    assert "Deployment demo-stable refused by the API server: spec.template: Invalid" in str(
        refused.value
    )
    assert len(str(refused.value)) <= MESSAGE_LIMIT
    assert api_server.requests, "the refusal came from the server"


@pytest.mark.parametrize("status", [403, 422, 500])
def test_a_failed_status_write_is_bounded(api_server: FakeApiServer, status: int) -> None:
    """The status subresource refused or failing: ClusterUnavailable, bounded like any error."""
    api_server.status = status
    with pytest.raises(ClusterUnavailable) as failed:
        _kube(api_server).apply_status(REF, {"phase": "Pending"})
    assert f"{status}: spec.template: Invalid" in str(failed.value)
    assert len(str(failed.value)) <= MESSAGE_LIMIT


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda kube: kube.get_inference_service("ns", "demo"), id="get"),
        pytest.param(lambda kube: kube.list_children("ns", "demo"), id="list"),
        pytest.param(lambda kube: kube.remove_annotation(REF, "a/b"), id="annotation"),
        pytest.param(lambda kube: kube.remove_finalizer(FINALIZED, "a/b"), id="finalizer"),
    ],
)
def test_a_failed_request_is_bounded(
    api_server: FakeApiServer, read: Callable[[KubeApi], object]
) -> None:
    """Other answers the operator cannot act on are temporary errors of bounded length."""
    api_server.status = 503
    with pytest.raises(FleetserveError) as failed:
        read(_kube(api_server))
    assert len(str(failed.value)) <= MESSAGE_LIMIT


def test_a_finalizer_is_removed_where_it_was_read_and_only_if_it_is_still_there(
    api_server: FakeApiServer,
) -> None:
    """A JSON patch that tests the entry it removes: another controller's list edit fails it."""
    api_server.status = 200
    kube = _kube(api_server)
    kube.remove_finalizer(FINALIZED, "a/b")
    ((method, path, patch),) = api_server.requests
    assert method == "PATCH"
    assert path == f"/apis/{naming.API_VERSION}/namespaces/ns/{naming.PLURAL}/demo"
    assert patch == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": "a/b"},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    api_server.status = 404
    assert kube.remove_finalizer(FINALIZED, "a/b") is None, "a service gone needs nothing"


def test_a_refused_event_is_logged_bounded(
    api_server: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Posting an Event fails only into the log, and the log line quotes a bounded refusal."""
    with caplog.at_level(logging.WARNING, logger="fleetserve_operator.controller.kube"):
        _kube(api_server).post_event(REF, EventNote("Normal", "Created", "Created Deployment"))
    (record,) = caplog.records
    assert "422: spec.template: Invalid" in record.getMessage()
    assert len(record.getMessage()) <= 2 * MESSAGE_LIMIT


def test_a_long_event_message_is_posted_bounded(api_server: FakeApiServer) -> None:
    """An Event carries at most MESSAGE_LIMIT characters of its note."""
    api_server.status = 201
    _kube(api_server).post_event(REF, EventNote("Warning", "ChildRefused", "y" * MIB))
    ((method, path, event),) = api_server.requests
    assert (method, path) == ("POST", "/api/v1/namespaces/ns/events")
    assert event["message"].startswith("yyy")
    assert len(event["message"]) <= MESSAGE_LIMIT


@pytest.fixture
def echo_server() -> Iterator[FakeApiServer]:
    """Stores nothing: a POST answers its body, the operator the `Update` owner it makes."""
    fake = FakeApiServer(status=201, message="")

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            fake.requests.append((self.command, self.path, body))
            entry = {"manager": "fleetserve-operator", "operation": "Update"}
            body = {**body, "metadata": {**body["metadata"], "managedFields": [entry]}}
            self.reply(201, json.dumps(body).encode(), {"Content-Type": "application/json"})

    with serve_http(Handler) as url:
        fake.url = url
        yield fake


def test_a_create_is_one_post(echo_server: FakeApiServer) -> None:
    """No ownership patch after it: the first apply onto the child takes its fields over."""
    created = _kube(echo_server).create(_deployment())
    [(method, path, body)] = echo_server.requests
    assert method == "POST"
    assert path.startswith("/apis/apps/v1/namespaces/ns/deployments?")
    assert "fieldManager=fleetserve-operator" in path
    assert "dryRun" not in path
    assert body == _deployment()
    assert created["spec"] == _deployment()["spec"]


def test_a_creates_dry_run_is_a_post_dry_run(echo_server: FakeApiServer) -> None:
    """Checked as the create it stands for: the same POST, stored nowhere."""
    _kube(echo_server).validate(_deployment(), current=None)
    [(method, path, body)] = echo_server.requests
    assert (method, body) == ("POST", _deployment())
    assert "dryRun=All" in path


OURS_CREATED = {
    "manager": naming.MANAGER, "operation": "Update", "apiVersion": "apps/v1",
    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}, "f:paused": {}}},
}  # fmt: skip
THEIRS = {
    "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
    "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}},
}  # fmt: skip


def test_the_operators_entries_become_one_apply_entry_owning_all_they_owned() -> None:
    """An earlier apply's entry and the create's are merged; no other manager's is touched."""
    applied = {**OURS_CREATED, "operation": "Apply", "fieldsV1": {"f:spec": {"f:template": {}}}}
    status = {**OURS_CREATED, "subresource": "status", "fieldsV1": {"f:status": {}}}
    other_version = {**OURS_CREATED, "apiVersion": "apps/v1beta1"}
    entries = [OURS_CREATED, THEIRS, applied, status, other_version]
    (ours, *others) = as_applied(entries, "apps/v1")
    assert ours == {
        "manager": naming.MANAGER, "operation": "Apply", "apiVersion": "apps/v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:replicas": {}, "f:paused": {}, "f:template": {}}},
    }  # fmt: skip
    assert others == [THEIRS, status, other_version]


@dataclass
class StoredChild:
    """A child the operator created, as a stand-in API server stores it."""

    conflicts: int = 0
    """Merge patches still to refuse with 409 (another manager wrote the child meanwhile)."""
    version: int = 7
    requests: list[tuple[str, str, Any]] = field(default_factory=list)


@pytest.fixture
def stored_child() -> Iterator[tuple[StoredChild, KubeApi]]:
    fake = StoredChild()

    class Handler(QuietHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            fake.requests.append((self.command, self.headers["Content-Type"], body))
            merge = self.command == "PATCH" and "merge-patch" in self.headers["Content-Type"]
            if merge and fake.conflicts:
                fake.conflicts -= 1
                fake.version += 1
                self.reply(409, json.dumps({"message": "modified"}).encode())
                return
            meta = {**_deployment()["metadata"], "uid": "u1", "resourceVersion": str(fake.version)}
            stored = {
                **_deployment(),
                "metadata": {**meta, "managedFields": [OURS_CREATED, THEIRS]},
            }
            self.reply(200, json.dumps(stored).encode(), {"Content-Type": "application/json"})

        do_GET = do_PATCH = _answer  # http.server's naming

    with serve_http(Handler) as url:
        configuration = kubernetes.client.Configuration(host=url)
        yield fake, KubeApi(kubernetes.client.ApiClient(configuration), timeout_s=5.0)


def _created_child() -> dict[str, Any]:
    meta = {**_deployment()["metadata"], "uid": "u1", "managedFields": [OURS_CREATED]}
    return {**_deployment(), "metadata": meta}


@pytest.mark.parametrize("conflicts", [0, 1], ids=["unchanged", "written-meanwhile"])
def test_the_first_apply_onto_a_created_child_takes_its_fields_over_first(
    stored_child: tuple[StoredChild, KubeApi], conflicts: int
) -> None:
    """Read fresh, the entries are written back under that resourceVersion, then applied.

    A conflict (another manager's write in between) reads them again.
    """
    fake, kube = stored_child
    fake.conflicts = conflicts
    kube.apply(_deployment(), current=_created_child())
    methods = [method for method, _, _ in fake.requests]
    assert methods == ["GET", "PATCH"] * (conflicts + 1) + ["PATCH"]
    (_, kind, patch) = fake.requests[-2]
    assert kind == "application/merge-patch+json"
    assert patch == {"metadata": {
        "managedFields": as_applied([OURS_CREATED, THEIRS], "apps/v1"),
        "resourceVersion": str(7 + conflicts),
    }}  # fmt: skip
    (_, kind, applied) = fake.requests[-1]
    assert kind == "application/apply-patch+yaml"
    assert applied["metadata"]["uid"] == "u1"


def test_a_take_over_that_keeps_conflicting_gives_up_for_a_retry(
    stored_child: tuple[StoredChild, KubeApi],
) -> None:
    """Three conflicts in a row: the reconcile is retried later, the child is not applied."""
    fake, kube = stored_child
    fake.conflicts = 3
    with pytest.raises(ClusterUnavailable):
        kube.apply(_deployment(), current=_created_child())
    assert [method for method, _, _ in fake.requests] == ["GET", "PATCH"] * 3


def test_a_child_replaced_before_its_take_over_is_not_written(
    stored_child: tuple[StoredChild, KubeApi],
) -> None:
    """The object read fresh has another uid: someone replaced the child; nothing is written."""
    fake, kube = stored_child
    replaced = _created_child()
    replaced["metadata"]["uid"] = "u0"
    with pytest.raises(ClusterUnavailable):
        kube.apply(_deployment(), current=replaced)
    assert [method for method, _, _ in fake.requests] == ["GET"]


STATUS_ENTRY = {**OURS_CREATED, "subresource": "status", "fieldsV1": {"f:status": {}}}


@pytest.mark.parametrize(
    "others",
    [pytest.param([], id="applied"), pytest.param([STATUS_ENTRY], id="and-a-subresource-update")],
)
def test_an_apply_onto_an_applied_child_is_one_request(
    stored_child: tuple[StoredChild, KubeApi], others: list[dict[str, Any]]
) -> None:
    """An operator `Update` entry of a subresource is not the create's: no take-over."""
    fake, kube = stored_child
    current = _created_child()
    current["metadata"]["managedFields"] = [*as_applied([OURS_CREATED], "apps/v1"), *others]
    kube.apply(_deployment(), current=current)
    assert [method for method, _, _ in fake.requests] == ["PATCH"]


def test_a_create_onto_a_taken_name_is_a_conflict_not_retried(
    api_server: FakeApiServer,
) -> None:
    api_server.status = 409
    with pytest.raises(ChildConflict):
        _kube(api_server).create(_deployment())
    assert len(api_server.requests) == 1


def test_the_environments_proxy_is_looked_up_once_not_before_every_request(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token's refresh before each request sets the host again, which looked it up."""
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # Where $KUBECONFIG pointed when the client was imported.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    configuration = KubeApi.from_environment().api_client.configuration
    assert configuration.proxy == "http://proxy.invalid:3128"
    lookups: list[int] = []
    looked_up = kubernetes.client.configuration.getproxies

    def counted() -> dict[str, str]:
        lookups.append(1)
        return looked_up()

    monkeypatch.setattr(kubernetes.client.configuration, "getproxies", counted)
    for _ in range(3):  # what every request runs first
        assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer secret-token"
    assert lookups == []
    assert configuration.proxy == "http://proxy.invalid:3128"


@pytest.mark.parametrize("status", [200, 404, 409], ids=["deleted", "gone", "replaced"])
def test_a_delete_names_the_uid_it_read_and_a_replaced_object_is_left(
    api_server: FakeApiServer, status: int
) -> None:
    """The uid is a precondition: 409 means another object holds the name now, left alone."""
    api_server.status = status
    child = {**_deployment(), "metadata": {**_deployment()["metadata"], "uid": "u1"}}
    _kube(api_server).delete(child)
    ((method, _, body),) = api_server.requests
    assert method == "DELETE"
    assert body == {"propagationPolicy": "Background", "preconditions": {"uid": "u1"}}


def test_a_delete_the_api_server_fails_is_unavailable(api_server: FakeApiServer) -> None:
    api_server.status = 503
    with pytest.raises(ClusterUnavailable):
        _kube(api_server).delete(_deployment())
    ((_, _, body),) = api_server.requests
    assert body == {"propagationPolicy": "Background"}, "no uid read, no precondition"
