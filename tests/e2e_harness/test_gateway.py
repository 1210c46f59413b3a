"""Traefik's command line and the Gateway API objects the gateway tests create (no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.gateway import CONTROLLER_NAME, LocalTraefik, gateway, gateway_class


def _argv() -> dict[str, str]:
    traefik = LocalTraefik(cast("LocalCluster", None), Path("traefik.log"))
    traefik.port, traefik.ping_port = 40001, 40002
    flags = traefik.argv(Path("/bin/traefik"))[1:]
    return dict(flag.removeprefix("--").split("=", 1) for flag in flags)


def test_traefik_listens_on_the_loopback_only() -> None:
    addresses = {name: value for name, value in _argv().items() if name.endswith(".address")}
    assert addresses == {
        "entryPoints.web.address": "127.0.0.1:40001",
        "entryPoints.traefik.address": "127.0.0.1:40002",
    }


def test_traefik_calls_nothing_outside_the_machine() -> None:
    flags = _argv()
    assert flags["global.checkNewVersion"] == "false"
    assert flags["global.sendAnonymousUsage"] == "false"


def test_the_gateway_listens_on_traefiks_entry_point_port() -> None:
    (listener,) = gateway("gateway", 40001)["spec"]["listeners"]
    assert (listener["protocol"], listener["port"]) == ("HTTP", 40001)
    assert gateway_class()["spec"]["controllerName"] == CONTROLLER_NAME
    assert (
        gateway("gateway", 40001)["spec"]["gatewayClassName"] == gateway_class()["metadata"]["name"]
    )
