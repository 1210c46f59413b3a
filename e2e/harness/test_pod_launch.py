"""How a runtime pod's container becomes a local command line (pure, no cluster)."""

from __future__ import annotations

import pytest

from fleetserve_e2e.pod_launch import (
    launch_plan,
    prestop_sleep_s,
    resolve_command,
    without_listen_flags,
)
from fleetserve_e2e.testing import runtime_deployment

COMMANDS = {"fleetserve-runtime": ["/venv/bin/fleetserve-runtime"]}


def _pod() -> dict[str, object]:
    template = runtime_deployment("demo", replicas=1)["spec"]["template"]
    metadata = {**template["metadata"], "name": "demo-abc", "namespace": "ns", "uid": "u1"}
    return {"metadata": metadata, "spec": template["spec"], "status": {}}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["--port", "8080", "--name", "x"], ["--name", "x"], id="separate-value"),
        pytest.param(["--port=8080", "--host=0.0.0.0"], [], id="equals-form"),
        pytest.param(["--model", "m"], ["--model", "m"], id="nothing-to-drop"),
    ],
)
def test_listen_flags_are_dropped(args: list[str], expected: list[str]) -> None:
    """Both spellings of --host/--port go; everything else stays in order."""
    assert without_listen_flags(args) == expected


def test_command_resolves_through_table_or_runs_as_written() -> None:
    """Known names map to the venv; empty means the image entrypoint; others stay."""
    assert resolve_command(["fleetserve-runtime", "serve"], COMMANDS) == [
        "/venv/bin/fleetserve-runtime",
        "serve",
    ]
    assert resolve_command([], COMMANDS) == ["/venv/bin/fleetserve-runtime"]
    assert resolve_command(["/bin/true"], COMMANDS) == ["/bin/true"]


def test_launch_plan_keeps_args_and_env_and_moves_the_port() -> None:
    """The pod's args and env survive; the listen address becomes 127.0.0.1:<port>."""
    pod = _pod()
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    plan = launch_plan(pod, container, commands=COMMANDS, base_env={"PATH": "/bin"}, port=4321)
    assert plan.argv[:2] == ("/venv/bin/fleetserve-runtime", "serve")
    assert plan.argv[-4:] == ("--host", "127.0.0.1", "--port", "4321")
    assert "8080" not in plan.argv
    assert plan.env["FLEETSERVE_LOG_LEVEL"] == "info"
    assert plan.env["PATH"] == "/bin"
    assert plan.readiness_path == "/v2/health/ready"


def test_prestop_sleep_is_read_from_the_runtime_container() -> None:
    """The native preStop sleep of the runtime container is honoured; none means no drain."""
    pod = _pod()
    assert prestop_sleep_s(pod) == 0.0
    spec = pod["spec"]
    assert isinstance(spec, dict)
    spec["containers"][0]["lifecycle"] = {"preStop": {"sleep": {"seconds": 5}}}
    assert prestop_sleep_s(pod) == 5.0
