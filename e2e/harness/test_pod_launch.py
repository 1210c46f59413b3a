"""How a Fleetserve pod's container becomes a local command line (pure, no cluster)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetserve_e2e.identity import ProjectedToken, isolated_env, projected_token
from fleetserve_e2e.kubeapi import JsonObject
from fleetserve_e2e.pod_launch import (
    HttpProbe,
    Image,
    flag_value,
    image_of,
    launch_plan,
    prestop_sleep_s,
    readiness_probe,
    resolve_command,
    without_listen_flags,
)
from fleetserve_e2e.testing import runtime_deployment

COMMANDS = {
    "fleetserve-runtime": ["/venv/bin/fleetserve-runtime"],
    "fleetserve-operator": ["/venv/bin/fleetserve-operator"],
}


def _ports() -> Callable[[], int]:
    """Host ports 40000, 40001, ... in the order the plan asks for them."""
    return itertools.count(40000).__next__


def _runtime_pod() -> JsonObject:
    template = runtime_deployment("demo", replicas=1)["spec"]["template"]
    metadata = {**template["metadata"], "name": "demo-abc", "namespace": "ns", "uid": "u1"}
    return {"metadata": metadata, "spec": template["spec"], "status": {}}


def _operator_pod(**env: str) -> JsonObject:
    """A pod as charts/fleetserve/templates/deployment.yaml renders it (abridged)."""
    env_vars: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items()]
    env_vars.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    container = {
        "name": "operator",
        "image": "fleetserve/fleetserve-operator:0.1.0",
        "args": ["run"],
        "env": env_vars,
        "ports": [
            {"name": "metrics", "containerPort": 8081},
            {"name": "health", "containerPort": 8080},
        ],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "health"}},
    }
    return {
        "metadata": {"name": "fs-operator-xyz", "namespace": "ns", "uid": "u2"},
        "spec": {"serviceAccountName": "fs-fleetserve", "containers": [container]},
        "status": {},
    }


def _container(pod: JsonObject) -> JsonObject:
    container: JsonObject = pod["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["--port", "8080", "--name", "x"], ["--name", "x"], id="separate-value"),
        pytest.param(["--port=8080", "--host=0.0.0.0"], [], id="equals-form"),
        pytest.param(["--model", "m"], ["--model", "m"], id="nothing-to-drop"),
        pytest.param(["--grpc-port", "9000", "--grpc-port=9001", "-v"], ["-v"], id="grpc"),
    ],
)
def test_listen_flags_are_dropped(args: list[str], expected: list[str]) -> None:
    """Both spellings of --host/--port go; everything else stays in order."""
    assert without_listen_flags(args) == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["--port", "9000"], "9000", id="separate-value"),
        pytest.param(["--port=9000"], "9000", id="equals-form"),
        pytest.param(["--port", "1", "--port=2"], "2", id="last-wins"),
        pytest.param(["--portal", "x", "--port"], None, id="absent"),
    ],
)
def test_flag_value_reads_both_spellings(args: list[str], expected: str | None) -> None:
    """As argparse reads it: either spelling, the last one wins, a bare flag has no value."""
    assert flag_value(args, "--port") == expected


def test_command_resolves_through_table_or_runs_as_written() -> None:
    """Known names map to the venv; empty means the image entrypoint; others stay."""
    runtime = Image.RUNTIME.value
    assert resolve_command(["fleetserve-runtime", "serve"], COMMANDS, entrypoint=runtime) == [
        "/venv/bin/fleetserve-runtime",
        "serve",
    ]
    assert resolve_command([], COMMANDS, entrypoint="fleetserve-operator") == [
        "/venv/bin/fleetserve-operator"
    ]
    assert resolve_command(["/bin/true"], COMMANDS, entrypoint=runtime) == ["/bin/true"]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        pytest.param("ghcr.io/fleetserve/fleetserve-runtime:0.1.0", Image.RUNTIME, id="runtime"),
        pytest.param("fleetserve/fleetserve-operator@sha256:ab", Image.OPERATOR, id="operator"),
        pytest.param("registry.k8s.io/pause:3.10", None, id="other"),
    ],
)
def test_image_kind_is_read_from_the_image_name(image: str, expected: Image | None) -> None:
    """The runtime and operator images are recognised by name; any other runs nothing."""
    assert image_of({"name": "c", "image": image}) is expected


def test_runtime_plan_keeps_args_and_env_and_maps_its_port() -> None:
    """The pod's args and env survive; --port 8080 becomes the host port mapped from 8080."""
    pod = _runtime_pod()
    plan = launch_plan(
        pod, _container(pod), commands=COMMANDS, base_env={"PATH": "/bin"}, allocate_port=_ports()
    )
    assert plan.image is Image.RUNTIME
    assert plan.argv[:2] == ("/venv/bin/fleetserve-runtime", "serve")
    assert plan.argv[-4:] == ("--host", "127.0.0.1", "--port", "40000")
    assert "8080" not in plan.argv
    assert plan.host_ports == {8080: 40000}
    assert plan.serving_port == 40000
    assert plan.grpc_port is None
    assert plan.readiness == HttpProbe(port=40000, path="/v2/health/ready")
    assert plan.env["FLEETSERVE_LOG_LEVEL"] == "info"
    assert plan.env["PATH"] == "/bin"


def test_runtime_grpc_listener_gets_its_own_host_port() -> None:
    """--grpc-port 9000 (as the operator renders it) moves to a host port of its own."""
    pod = _runtime_pod()
    container = _container(pod)
    container["args"] = [*container["args"], "--grpc-port=9000"]
    container["ports"] = [*container["ports"], {"name": "grpc", "containerPort": 9000}]
    plan = launch_plan(pod, container, commands=COMMANDS, base_env={}, allocate_port=_ports())
    assert plan.host_ports == {8080: 40000, 9000: 40001}
    assert plan.argv[-6:] == ("--host", "127.0.0.1", "--port", "40000", "--grpc-port", "40001")
    assert "--grpc-port=9000" not in plan.argv
    assert (plan.serving_port, plan.grpc_port) == (40000, 40001)


def test_runtime_without_port_flag_is_mapped_from_its_default_port() -> None:
    """No --port: the runtime would bind 8080, so 8080 is what gets mapped and passed on."""
    pod = _runtime_pod()
    container = _container(pod)
    container["args"] = without_listen_flags(container["args"])
    plan = launch_plan(pod, container, commands=COMMANDS, base_env={}, allocate_port=_ports())
    assert plan.argv[-2:] == ("--port", "40000")
    assert plan.host_ports == {8080: 40000}


def test_operator_plan_runs_the_entrypoint_with_ports_moved_through_env() -> None:
    """The entrypoint runs with the chart's args; port variables name the mapped host ports."""
    pod = _operator_pod(FLEETSERVE_METRICS_PORT="8081", FLEETSERVE_LIVENESS_PORT="8080")
    plan = launch_plan(pod, _container(pod), commands=COMMANDS, base_env={}, allocate_port=_ports())
    assert plan.image is Image.OPERATOR
    assert plan.argv == ("/venv/bin/fleetserve-operator", "run")
    assert plan.host_ports == {8080: 40000, 8081: 40001}
    assert plan.env["FLEETSERVE_METRICS_PORT"] == "40001"
    assert plan.env["FLEETSERVE_LIVENESS_PORT"] == "40000"
    assert plan.env["FLEETSERVE_LISTEN_ADDRESS"] == "127.0.0.1"
    assert plan.env["POD_NAME"] == "fs-operator-xyz"
    assert plan.readiness == HttpProbe(port=40000, path="/healthz")
    assert plan.serving_port is None


def test_operator_defaults_are_mapped_and_a_disabled_endpoint_stays_off() -> None:
    """Unset port variables still get host ports (never the fixed default); 0 stays 0."""
    pod = _operator_pod(FLEETSERVE_METRICS_PORT="0")
    plan = launch_plan(pod, _container(pod), commands=COMMANDS, base_env={}, allocate_port=_ports())
    assert plan.env["FLEETSERVE_METRICS_PORT"] == "0"
    assert plan.env["FLEETSERVE_LIVENESS_PORT"] == str(plan.host_ports[8080])
    assert set(plan.host_ports) == {8080, 8081}


@pytest.mark.parametrize(
    ("port", "expected"),
    [
        pytest.param("health", HttpProbe(port=2, path="/healthz"), id="named"),
        pytest.param(8081, HttpProbe(port=1, path="/healthz"), id="number"),
        pytest.param("8081", HttpProbe(port=1, path="/healthz"), id="number-as-string"),
    ],
)
def test_readiness_probe_port_resolves_through_the_port_map(
    port: int | str, expected: HttpProbe
) -> None:
    """A probe's port, named or numeric, becomes the host port its container port maps to."""
    container = _container(_operator_pod())
    container["readinessProbe"]["httpGet"]["port"] = port
    assert readiness_probe(container, {8081: 1, 8080: 2}) == expected


def test_readiness_probe_on_an_unknown_port_is_refused() -> None:
    """A probe naming no port of the container is a broken pod spec, said so at launch."""
    container = _container(_operator_pod())
    container["readinessProbe"]["httpGet"]["port"] = "nope"
    with pytest.raises(ValueError, match="'nope'"):
        readiness_probe(container, {8081: 1, 8080: 2})


def test_no_readiness_probe_means_ready_while_running() -> None:
    """As for a kubelet, a container without a readiness probe is ready once it runs."""
    container = _container(_operator_pod())
    del container["readinessProbe"]
    assert readiness_probe(container, {8081: 1, 8080: 2}) is None


def test_host_credentials_and_settings_never_reach_the_process() -> None:
    """Admin kubeconfig, in-cluster variables, proxies and FLEETSERVE_* are dropped.

    The pod's own token kubeconfig is then the only way into the cluster.
    """
    host = {
        "PATH": "/bin",
        "E2E_HARNESS_CLUSTER": "/tmp/c",
        "KUBECONFIG": "/admin/kubeconfig",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "HTTPS_PROXY": "http://proxy:3128",
        "http_proxy": "http://proxy:3128",
        "FLEETSERVE_VERBOSE": "true",
    }
    assert isolated_env(host) == {"PATH": "/bin", "E2E_HARNESS_CLUSTER": "/tmp/c"}
    pod = _operator_pod()
    plan = launch_plan(
        pod,
        _container(pod),
        commands=COMMANDS,
        base_env=host,
        allocate_port=_ports(),
        kubeconfig=Path("/work/pods/ns_fs.kubeconfig"),
    )
    assert plan.env["KUBECONFIG"] == "/work/pods/ns_fs.kubeconfig"
    assert not {"KUBERNETES_SERVICE_HOST", "HTTPS_PROXY", "http_proxy"} & set(plan.env)
    assert "FLEETSERVE_VERBOSE" not in plan.env


def test_without_a_token_the_process_gets_no_kubeconfig_at_all() -> None:
    """No token: KUBECONFIG is the empty file, never a fallback to ~/.kube/config."""
    pod = _runtime_pod()
    plan = launch_plan(pod, _container(pod), commands=COMMANDS, base_env={}, allocate_port=_ports())
    assert plan.env["KUBECONFIG"] == os.devnull


def test_ports_get_distinct_host_ports_even_if_a_probe_repeats_one() -> None:
    """Two free-port probes may return the same port; the plan never maps two ports to it."""
    repeats = iter([40000, 40000, 40001]).__next__
    pod = _operator_pod()
    plan = launch_plan(pod, _container(pod), commands=COMMANDS, base_env={}, allocate_port=repeats)
    assert sorted(plan.host_ports.values()) == [40000, 40001]


def test_projected_token_follows_the_admission_plugins_volume() -> None:
    """A token is wanted exactly when the pod has the projected serviceAccountToken volume."""
    pod = _operator_pod()
    assert projected_token(pod) is None
    pod["spec"]["volumes"] = [
        {"name": "tmp", "emptyDir": {}},
        {
            "name": "kube-api-access-x1",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt"}},
                ]
            },
        },
    ]
    assert projected_token(pod) == ProjectedToken(
        account="fs-fleetserve", expiration_s=3607, audiences=()
    )


def test_prestop_sleep_is_read_from_the_runtime_container() -> None:
    """The native preStop sleep of the runtime container is honoured; none means no drain."""
    pod = _runtime_pod()
    assert prestop_sleep_s(pod) == 0.0
    _container(pod)["lifecycle"] = {"preStop": {"sleep": {"seconds": 5}}}
    assert prestop_sleep_s(pod) == 5.0
