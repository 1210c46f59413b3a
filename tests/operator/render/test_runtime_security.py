"""The runtime's security settings reach every track's pods; the route strips its headers.

TLS, the priority token and the generation limits become volumes, flags and probes; the
HTTPRoute removes the headers only the priority token grants, and the tenant header unless a
trusted gateway sets it.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator import contract
from fleetserve_operator.testing import make_spec
from tests.operator.render.rendered import children_by_key, flag_value

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}], "hostnames": ["a.example"]}
CHAT = {"name": "chat", "version": "1", "uri": "builtin://synthetic-generate"}
TRACKS = ("demo-stable", "demo-fallback")


def _children(**sections: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return children_by_key(make_spec(**sections))


def _pod(children: dict[tuple[str, str], Any], name: str) -> Any:
    return children[("Deployment", name)]["spec"]["template"]


def _secret_file(pod: Any, volume: str) -> tuple[Any, Any, list[str]]:
    """The Secret behind the pod's volume `volume`, the container's mount of it, its args."""
    (container,) = pod["spec"]["containers"]
    secret = next(v for v in pod["spec"]["volumes"] if v["name"] == volume)["secret"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume)
    return secret, mount, container["args"]


@pytest.mark.parametrize("model", [None, CHAT], ids=["encoder", "generative"])
def test_every_route_rule_strips_the_privileged_headers(model: dict[str, str] | None) -> None:
    """A client behind the gateway cannot claim X-Fleetserve-Priority or -Timeout-Ms."""
    sections: dict[str, Any] = {"traffic": GATEWAY, "fallback": {"enabled": True}}
    if model is not None:
        sections["model"] = model
    route = _children(**sections)[("HTTPRoute", "demo")]
    assert route["spec"]["rules"]
    for rule in route["spec"]["rules"]:
        assert {"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "remove": ["X-Fleetserve-Priority", "X-Fleetserve-Timeout-Ms", "X-Fleetserve-Tenant"]
        }} in rule["filters"]  # fmt: skip


@pytest.mark.parametrize("trusted", [False, True])
def test_the_tenant_header_passes_the_route_only_from_a_trusted_gateway(trusted: bool) -> None:
    """`runtime.tenants.trustHeader`: the route keeps X-Fleetserve-Tenant; otherwise removes it."""
    tenants = {"secretRef": {"name": "callers", "key": "table"}, "trustHeader": trusted}
    route = _children(traffic=GATEWAY, runtime={"tenants": tenants})[("HTTPRoute", "demo")]
    for rule in route["spec"]["rules"]:
        (strip,) = [f for f in rule["filters"] if f["type"] == "RequestHeaderModifier"]
        removed = strip["requestHeaderModifier"]["remove"]
        assert ("X-Fleetserve-Tenant" in removed) is not trusted
        assert {"X-Fleetserve-Priority", "X-Fleetserve-Timeout-Ms"} <= set(removed)


@pytest.mark.parametrize("trusted", [False, True])
def test_the_tenants_table_is_a_read_only_secret_file_on_every_track(trusted: bool) -> None:
    """`runtime.tenants`: its key mounted as a file, `--tenants-file`, the trust flag if set."""
    tenants = {"secretRef": {"name": "callers", "key": "table"}, "trustHeader": trusted}
    children = _children(runtime={"tenants": tenants}, fallback={"enabled": True})
    for name in TRACKS:
        secret, mount, args = _secret_file(_pod(children, name), "tenants")
        assert secret["secretName"] == "callers"
        assert secret["items"] == [{"key": "table", "path": contract.TENANTS_KEY}]
        assert mount == {"name": "tenants", "mountPath": contract.TENANTS_MOUNT, "readOnly": True}
        assert flag_value(args, "--tenants-file") == contract.TENANTS_FILE
        assert ("--tenants-trust-header" in args) is trusted


def test_without_tenants_the_pods_read_no_table() -> None:
    """No `runtime.tenants`: no volume, no flag (the runtime serves one anonymous tenant)."""
    children = _children(fallback={"enabled": True})
    for name in TRACKS:
        (container,) = _pod(children, name)["spec"]["containers"]
        assert not any(a.startswith("--tenants") for a in container["args"])


def test_tls_mounts_the_secret_and_probes_over_https_on_every_track() -> None:
    """`runtime.tls`: the Secret read-only, both files as flags, HTTPS probes and scrapes."""
    children = _children(runtime={"tls": {"secretName": "demo-cert"}}, fallback={"enabled": True})
    for name in TRACKS:
        pod = _pod(children, name)
        (container,) = pod["spec"]["containers"]
        secret, mount, args = _secret_file(pod, "tls")
        assert secret["secretName"] == "demo-cert"
        assert {i["key"] for i in secret["items"]} == {"tls.crt", "tls.key"}
        assert mount == {"name": "tls", "mountPath": contract.TLS_MOUNT, "readOnly": True}
        assert flag_value(args, "--tls-cert-file") == contract.TLS_CERT_FILE
        assert flag_value(args, "--tls-key-file") == contract.TLS_KEY_FILE
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["scheme"] == "HTTPS", (name, probe)
        assert pod["metadata"]["annotations"]["prometheus.io/scheme"] == "https"


def test_without_tls_the_pods_are_as_before() -> None:
    """No TLS: no volume, no flags, probes at the API server's default scheme, no annotation."""
    pod = _pod(_children(), "demo-stable")
    (container,) = pod["spec"]["containers"]
    assert not any(arg.startswith("--tls") for arg in container["args"])
    assert "scheme" not in container["readinessProbe"]["httpGet"]
    assert "prometheus.io/scheme" not in pod["metadata"]["annotations"]


def test_priority_token_is_a_read_only_secret_file_on_every_track() -> None:
    """`runtime.priorityTokenSecretRef`: its key mounted as a file, `--priority-token-file`."""
    ref = {"name": "tokens", "key": "priority"}
    children = _children(runtime={"priorityTokenSecretRef": ref}, fallback={"enabled": True})
    for name in TRACKS:
        secret, mount, args = _secret_file(_pod(children, name), "priority")
        assert secret["secretName"] == "tokens"
        assert secret["items"] == [{"key": "priority", "path": "token"}]
        assert mount["readOnly"] is True
        assert contract.PRIORITY_TOKEN_FILE.startswith(mount["mountPath"] + "/")
        assert flag_value(args, "--priority-token-file") == contract.PRIORITY_TOKEN_FILE


def test_generation_limits_render_as_flags_only_when_set() -> None:
    """Set: `--generation-default-max-tokens` etc.; defaults: no new flag (no restart)."""
    tuned = {"defaultMaxTokens": 64, "maxOutputTokens": 128, "allowIgnoreEos": True}
    (container,) = _pod(_children(model=CHAT, generation=tuned), "demo-stable")["spec"][
        "containers"
    ]
    args = container["args"]
    assert flag_value(args, "--generation-default-max-tokens") == "64"
    assert flag_value(args, "--generation-max-output-tokens") == "128"
    assert "--generation-allow-ignore-eos" in args
    (plain,) = _pod(_children(model=CHAT), "demo-stable")["spec"]["containers"]
    assert not {"--generation-default-max-tokens", "--generation-allow-ignore-eos"} & set(
        plain["args"]
    )


def test_max_output_tokens_below_the_default_is_refused() -> None:
    """The runtime would refuse to start; the spec names both fields and values first."""
    with pytest.raises(ValidationError, match=r"maxOutputTokens \(100\) must be >= .*\(512\)"):
        make_spec(model=CHAT, generation={"maxOutputTokens": 100})
