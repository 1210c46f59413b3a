"""`KubeApi` when a child's API group is not served: a missing KEDA is a spec problem, not a crash.

A loopback stand-in for the API server answers every request as kube-apiserver answers a path
under an API group it does not serve: `404 page not found`, in plain text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from fleetserve_operator.controller.kube import KubeApi
from fleetserve_operator.errors import DependencyMissing
from fleetserve_operator.render import Owner, desired_children
from fleetserve_operator.spec import InferenceServiceStatus
from fleetserve_operator.testing import QuietHandler, make_spec, serve_http

OWNER = Owner(name="demo", namespace="ns", uid="uid-demo")


@pytest.fixture
def unserved() -> Iterator[KubeApi]:
    """A `KubeApi` on an API server that serves no API group at all."""

    class Handler(QuietHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            payload = b"404 page not found\n"
            self.reply(404, payload, {"Content-Type": "text/plain; charset=utf-8"})

        do_GET = do_POST = do_PATCH = do_DELETE = _answer  # http.server's naming

    with serve_http(Handler) as url:
        configuration = kubernetes.client.Configuration(host=url)
        yield KubeApi(kubernetes.client.ApiClient(configuration), timeout_s=5.0)


def _scaled_object() -> dict[str, Any]:
    spec = make_spec(scaling={"maxReplicas": 3, "target": 2})
    children = desired_children(
        OWNER, spec, InferenceServiceStatus(), prometheus_url="http://prometheus:9090"
    )
    (scaled,) = [child for child in children if child["kind"] == "ScaledObject"]
    return scaled


def test_a_scaled_object_without_keda_is_not_found(unserved: KubeApi) -> None:
    """The plain-text 404 of an unserved group reads as "no such object", not a crash."""
    assert unserved.get_child(_scaled_object()) is None


def test_writing_a_scaled_object_without_keda_names_spec_scaling(unserved: KubeApi) -> None:
    """The dry-run of a ScaledObject is refused with DependencyMissing on spec.scaling."""
    with pytest.raises(DependencyMissing) as caught:
        unserved.validate(_scaled_object(), current=None)
    assert caught.value.field == "spec.scaling"
    assert "KEDA" in caught.value.message


def _grpc_route() -> dict[str, Any]:
    spec = make_spec(
        runtime={"grpc": {"enabled": True}},
        traffic={
            "provider": "gateway-api",
            "parentRefs": [{"name": "gw"}],
            "hostnames": ["oip.example"],
        },
    )
    children = desired_children(OWNER, spec, InferenceServiceStatus())
    (route,) = [child for child in children if child["kind"] == "GRPCRoute"]
    return route


def test_writing_a_grpc_route_without_its_crd_names_spec_runtime_grpc(unserved: KubeApi) -> None:
    """A Gateway API older than GRPCRoute v1: the dry-run names spec.runtime.grpc."""
    with pytest.raises(DependencyMissing) as caught:
        unserved.validate(_grpc_route(), current=None)
    assert caught.value.field == "spec.runtime.grpc"
    assert "GRPCRoute" in caught.value.message


def test_children_are_listed_where_grpc_routes_are_not_served() -> None:
    """Only GRPCRoutes unserved: every other kind is listed, the missing one is skipped."""
    asked: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            asked.append(self.path.split("?", 1)[0])
            grpc = "/grpcroutes" in self.path
            payload = b"404 page not found\n" if grpc else b'{"items": []}'
            content_type = "text/plain" if grpc else "application/json"
            self.reply(404 if grpc else 200, payload, {"Content-Type": content_type})

    with serve_http(Handler) as url:
        configuration = kubernetes.client.Configuration(host=url)
        kube = KubeApi(kubernetes.client.ApiClient(configuration), timeout_s=5.0)
        assert kube.list_children("ns", "demo") == []
    assert "/apis/gateway.networking.k8s.io/v1/namespaces/ns/grpcroutes" in asked
    assert "/apis/gateway.networking.k8s.io/v1/namespaces/ns/httproutes" in asked


def test_an_unserved_kind_is_not_listed_again_until_the_recheck() -> None:
    """A 404 is remembered for a while: no reconcile in between asks for that kind."""
    asked: list[str] = []
    now = [0.0]

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            asked.append(self.path.split("?", 1)[0].rsplit("/", 1)[-1])
            grpc = "/grpcroutes" in self.path
            payload = b"404 page not found\n" if grpc else b'{"items": []}'
            self.reply(404 if grpc else 200, payload)

    with serve_http(Handler) as url:
        configuration = kubernetes.client.Configuration(host=url)
        kube = KubeApi(
            kubernetes.client.ApiClient(configuration), timeout_s=5.0, clock=lambda: now[0]
        )
        kube.list_children("ns", "demo")
        kube.list_children("ns", "demo")
        assert asked.count("grpcroutes") == 1
        assert asked.count("deployments") == 2
        now[0] = 61.0
        kube.list_children("ns", "demo")
    assert asked.count("grpcroutes") == 2


def test_a_kind_written_is_listed_again_at_once() -> None:
    """A route written after its CRD appeared is listed by the next reconcile, not a minute on."""
    served = [False]
    asked: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            asked.append(self.path.split("?", 1)[0].rsplit("/", 1)[-1])
            absent = "/grpcroutes" in self.path and not served[0]
            self.reply(404 if absent else 200, b"404" if absent else b'{"items": []}')

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.reply(201, b'{"metadata": {"uid": "u"}}')

    with serve_http(Handler) as url:
        configuration = kubernetes.client.Configuration(host=url)
        kube = KubeApi(kubernetes.client.ApiClient(configuration), timeout_s=5.0, clock=lambda: 0.0)
        kube.list_children("ns", "demo")
        served[0] = True
        kube.validate(_grpc_route(), current=None)
        kube.list_children("ns", "demo")
    assert asked.count("grpcroutes") == 2
