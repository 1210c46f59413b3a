"""The Helm chart: lint, render, hardened pod, RBAC and CRD equal to their sources, strict values.

Tenancy too: the PodMonitor keeps the target's namespace, the NetworkPolicies are judged by
what they let through, and the Prometheus allowlist is read back as the operator reads it.
Runs the helm that `make tools` builds against the chart directory; no cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest
import yaml

from fleetserve_operator.spec import ConditionType, RolloutPhase
from tests.chart.fixture_types import Helm, Manifest, Only, ReadConfig, Render

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fleetserve"
ROLE = ROOT / "operator" / "rbac" / "role.yaml"
CRD = ROOT / "crds" / "serving.fleetserve.io_inferenceservices.yaml"
ALL_FEATURES = [
    "--set",
    "monitoring.podMonitor.enabled=true,monitoring.serviceMonitor.enabled=true",
    "--set",
    "monitoring.prometheusRule.enabled=true",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.runtimeNamespaces={ml}",
    "--set",
    "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
]


def role_rules() -> list[Manifest]:
    """The rules of operator/rbac/role.yaml's ClusterRole."""
    (role,) = [d for d in yaml.safe_load_all(ROLE.read_text()) if d["kind"] == "ClusterRole"]
    rules: list[Manifest] = role["rules"]
    return rules


def test_lint_passes_with_strict(helm: Helm) -> None:
    """`helm lint --strict` passes with the defaults and with every optional feature on."""
    helm("lint", "--strict")
    helm("lint", "--strict", *ALL_FEATURES)


def test_default_render_has_the_core_objects_only(render: Render) -> None:
    """Defaults: CRD, operator, PDB, ServiceAccount, RBAC, Service, dashboard, admission."""
    kinds = sorted(m["kind"] for m in render())
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "CustomResourceDefinition",
        "Deployment",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]


def test_operator_pod_is_hardened(render: Render, only: Only) -> None:
    """Non-root, read-only root fs, no escalation, no capabilities, seccomp RuntimeDefault."""
    pod = only(render(), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_operator_runs_the_image_entrypoint_with_its_config(
    render: Render, only: Only, operator_config: ReadConfig
) -> None:
    """`run`, probes on kopf's /healthz, FLEETSERVE_* env read by OperatorConfig as meant."""
    deployment = only(render("--set", "watchNamespaces={ml,search}"), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert container["image"] == "fleetserve/fleetserve-operator:0.1.0"
    assert container["args"] == ["run"]
    config = operator_config(container)
    assert config.namespaces == ["ml", "search"]
    assert config.allowed_prometheus_urls == []
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": config.metrics_port, "health": config.liveness_port}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_allowed_prometheus_urls_reach_the_operator_allowlist(
    render: Render, only: Only, operator_config: ReadConfig
) -> None:
    """operator.allowedPrometheusUrls becomes the allowlist OperatorConfig checks specs with."""
    from fleetserve_operator.errors import InvalidSpec

    allowed = ["http://prometheus.monitoring:9090", "https://thanos.monitoring:10902/eu"]
    deployment = only(
        render("--set-json", f"operator.allowedPrometheusUrls={json.dumps(allowed)}"),
        "Deployment",
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config = operator_config(container)
    assert config.allowed_prometheus_urls == allowed
    config.prometheus_allowlist.check("http://prometheus.monitoring:9090")
    config.prometheus_allowlist.check("https://thanos.monitoring:10902/eu/api")
    for url in ("http://prometheus.ml:9090", "https://thanos.monitoring:10902/us"):
        with pytest.raises(InvalidSpec):
            config.prometheus_allowlist.check(url)


def test_cluster_role_rules_are_role_yaml_rules(render: Render, only: Only) -> None:
    """Cluster-wide install: the ClusterRole's rules are role.yaml's, in order."""
    manifests = render()
    assert only(manifests, "ClusterRole")["rules"] == role_rules()
    binding = only(manifests, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fs-fleetserve", "namespace": "fleetserve-system"}
    ]


def test_namespaced_install_splits_role_yaml_rules(render: Render, only: Only) -> None:
    """Watched namespaces: role.yaml's rules, cluster-scoped ones cluster-wide, the rest per ns.

    Cluster-wide also: list and watch on namespaces, which kopf needs only when namespaced
    (test_no_cluster_role_reaches_leases_or_namespaces checks that rule).
    """
    manifests = render("--set", "watchNamespaces={ml,search}")
    cluster = only(manifests, "ClusterRole", "fs-fleetserve-cluster")["rules"]
    namespaced = only(manifests, "ClusterRole", "fs-fleetserve-namespaced")["rules"]
    from_role = [rule for rule in cluster if rule["resources"] != ["namespaces"]]
    assert sorted(map(json.dumps, from_role + namespaced)) == sorted(map(json.dumps, role_rules()))
    assert {r for rule in from_role for r in rule["resources"]} == {"customresourcedefinitions"}
    bindings = [
        m for m in manifests if m["kind"] == "RoleBinding" and m["roleRef"]["kind"] == "ClusterRole"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml", "search"]
    assert {b["roleRef"]["name"] for b in bindings} == {"fs-fleetserve-namespaced"}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="cluster-wide"),
        pytest.param(["--set", "watchNamespaces={ml}"], id="namespaced"),
    ],
)
def test_no_cluster_role_reaches_leases_or_namespaces(values: list[str], render: Render) -> None:
    """No ClusterRole grants Leases (the control plane's leader leases, the nodes' heartbeats).

    The operator's one Lease is a Role's, by name, in the release's namespace
    (test_chart_ha checks that Role). Namespaces: only a namespaced install's cluster-scoped
    role may list and watch them (kopf finds its watched namespaces so), nothing more.
    """
    manifests = render(*values)
    cluster_roles = [m for m in manifests if m["kind"] == "ClusterRole"]
    assert cluster_roles
    namespace_rules = []
    for role in cluster_roles:
        for rule in role["rules"]:
            assert "leases" not in rule["resources"], role["metadata"]
            assert "coordination.k8s.io" not in rule["apiGroups"], role["metadata"]
            if "namespaces" in rule["resources"]:
                namespace_rules.append((role["metadata"]["name"], rule))
    if values:
        assert namespace_rules == [
            (
                "fs-fleetserve-cluster",
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
            )
        ]
    else:
        assert namespace_rules == []


def test_admission_policy_binds_the_operator_account_only(render: Render, only: Only) -> None:
    """The policy matches Deployments the operator's account writes, and the binding denies."""
    manifests = render("--set-json", 'admissionPolicy.allowedServiceAccounts=["model-reader"]')
    policy = only(manifests, "ValidatingAdmissionPolicy")
    binding = only(manifests, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["apps"], ["deployments"])
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    (condition,) = spec["matchConditions"]
    account = "system:serviceaccount:fleetserve-system:fs-fleetserve"
    assert condition["expression"] == f'request.userInfo.username == "{account}"'
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert json.loads(variables["serviceAccounts"]) == ["default", "model-reader"]
    checks = " ".join(v["expression"] for v in spec["validations"])
    for field in ("hostNetwork", "hostPID", "hostIPC", "privileged", "hostPath",
                  "serviceAccountName"):  # fmt: skip
        assert field in checks, field
    for validation in spec["validations"]:
        assert validation["messageExpression"], validation["expression"]
    kinds = {m["kind"] for m in render("--set", "admissionPolicy.enabled=false")}
    assert "ValidatingAdmissionPolicy" not in kinds


def test_chart_copies_are_byte_identical_to_their_sources() -> None:
    """crds/ and files/operator-rbac.yaml are copies (`make chart-sync` refreshes them)."""
    assert (CHART / "crds" / CRD.name).read_bytes() == CRD.read_bytes()
    assert (CHART / "files" / "operator-rbac.yaml").read_bytes() == ROLE.read_bytes()
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [CRD.name]


def test_all_optional_features_render(render: Render, only: Only) -> None:
    """PodMonitor (target labels win), ServiceMonitor (scraped labels win), PrometheusRule."""
    manifests = render("--set", "watchNamespaces={ml}", *ALL_FEATURES)
    pod_monitor = only(manifests, "PodMonitor")["spec"]
    assert pod_monitor["namespaceSelector"] == {"matchNames": ["ml"]}
    assert pod_monitor["selector"] == {
        "matchLabels": {"app.kubernetes.io/managed-by": "fleetserve-operator"}
    }
    (runtime_endpoint,) = pod_monitor["podMetricsEndpoints"]
    assert runtime_endpoint["port"] == "http"
    # The target's namespace wins over one a tenant's pod exports (it becomes exported_namespace).
    assert runtime_endpoint["honorLabels"] is False
    (endpoint,) = only(manifests, "ServiceMonitor")["spec"]["endpoints"]
    # The operator's per-InferenceService series carry the service's namespace.
    assert (endpoint["port"], endpoint["honorLabels"]) == ("metrics", True)
    rules = only(manifests, "PrometheusRule")["spec"]["groups"]
    alerts = {r["alert"] for group in rules for r in group["rules"]}
    readme = (CHART / "README.md").read_text()
    assert alerts == set(re.findall(r"^\| `(Fleetserve\w+)`", readme, re.MULTILINE))


def test_dashboard_is_valid_grafana_json(render: Render, only: Only) -> None:
    """The dashboard ConfigMap holds JSON with the panels the issue asks for."""
    config_map = only(render(), "ConfigMap", "fs-fleetserve-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["fleetserve.json"])
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    topics = ("request rate", "p99", "batch size", "queue wait", "padding", "canary weight")
    for topic in (*topics, "rolled back", "phase"):
        assert topic in titles


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(["--set", "replicas=two"], "/replicas", id="wrong-type"),
        pytest.param(
            ["--set", "replicas=2,leaderElection.enabled=false"],
            "/replicas",
            id="second-replica-without-leader-election",
        ),
        pytest.param(["--set", "operator.logFormat=yaml"], "/operator/logFormat", id="enum"),
        pytest.param(["--set", "operator.metricsPort=70000"], "/operator/metricsPort", id="port"),
        pytest.param(["--set", "watchNamespaces={Bad_NS}"], "/watchNamespaces/0", id="ns-name"),
        pytest.param(["--set", "replica=1"], "'replica' not allowed", id="unknown-key"),
        pytest.param(
            ["--set", "monitoring.podMonitor.enabeld=true"], "'enabeld' not allowed", id="typo"
        ),
        pytest.param(
            ["--set", "operator.allowedPrometheusUrls={file:///etc/passwd}"],
            "/operator/allowedPrometheusUrls/0",
            id="allowlist-scheme",
        ),
        pytest.param(
            ["--set", "runtime.image.digest=latest"], "/runtime/image/digest", id="runtime-digest"
        ),
        pytest.param(
            ["--set", "runtime.cpuImage.digest=sha256:abc"],
            "/runtime/cpuImage/digest",
            id="runtime-cpu-digest",
        ),
        pytest.param(
            ["--set", "runtime.image.repository="], "/runtime/image/repository", id="no-repository"
        ),
        pytest.param(
            ["--set", "runtime.image.pullPolicy=Always"],
            "'pullPolicy' not allowed",
            id="runtime-pull-policy-is-the-services",
        ),
        pytest.param(
            ["--set", "networkPolicy.apiServer.cidrs={10.0.0.1}"],
            "/networkPolicy/apiServer/cidrs/0",
            id="cidr",
        ),
        pytest.param(
            ["--set-json", "networkPolicy.prometheus.namespaces=[]"],
            "/networkPolicy/prometheus/namespaces",
            id="prometheus-in-any-namespace",
        ),
    ],
)
def test_schema_rejects_bad_values(values: list[str], message: str, helm: Helm) -> None:
    """values.schema.json fails template and lint with a message naming the field."""
    for command in ("template", "lint"):
        proc = helm(command, *values, check=False)
        assert proc.returncode != 0, f"helm {command} accepted {values}"
        assert message in proc.stderr + proc.stdout


def queries(render: Render, only: Only) -> str:
    """The PromQL of the PrometheusRule and the dashboard, as text."""
    manifests = render(*ALL_FEATURES)
    dashboard = only(manifests, "ConfigMap", "fs-fleetserve-dashboard")["data"]
    return json.dumps(only(manifests, "PrometheusRule")["spec"]) + str(dashboard["fleetserve.json"])


def test_alerts_and_dashboard_match_real_phases_and_conditions(render: Render, only: Only) -> None:
    """Each `phase` and `condition` matcher names a RolloutPhase or a ConditionType."""
    text = queries(render, only)
    for label, values in (("phase", RolloutPhase), ("condition", ConditionType)):
        used = set(re.findall(rf'\b{label}=\\?"(\w+)', text))
        assert used, f"no {label} matcher found"
        assert used <= {v.value for v in values}, f"unknown {label}: {sorted(used)}"


def test_long_release_names_give_valid_object_names(helm: Helm) -> None:
    """A 53-character release name (Helm's limit) still yields names of at most 63 characters."""
    out = helm("template", "r" * 53, *ALL_FEATURES).stdout
    names = [doc["metadata"]["name"] for doc in yaml.safe_load_all(out) if doc]
    assert names
    assert max(map(len, names)) <= 63


NETWORK_POLICY = [
    "--set", "watchNamespaces={ml,search}",
    "--set", "networkPolicy.enabled=true",
    "--set", "networkPolicy.gatewayNamespaces={gateway}",
    "--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
]  # fmt: skip


@dataclass(frozen=True)
class Pod:
    """A pod as a NetworkPolicy sees it: its namespace, labels and (as a destination) IP."""

    namespace: str
    labels: dict[str, str]
    ip: str = "10.1.0.9"


PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
DNS = Pod("kube-system", {"k8s-app": "kube-dns"})
GATEWAY = Pod("gateway", {"app": "envoy"})
API_SERVER = Pod("default", {}, ip="10.0.0.1")
"""The API server, at the address NETWORK_POLICY gives for it."""
METADATA_SERVICE = Pod("default", {}, ip="169.254.169.254")
"""The cloud metadata service, which no pod of the chart may reach."""


def network_policies(manifests: list[Manifest]) -> list[Manifest]:
    """The NetworkPolicies among the rendered manifests."""
    return [m for m in manifests if m["kind"] == "NetworkPolicy"]


def runtime_pod(namespace: str) -> Pod:
    """A canary pod of an InferenceService, labelled as the operator labels it."""
    from fleetserve_operator.naming import Track, labels

    return Pod(namespace, labels("search-ranker", Track.CANARY, "2"))


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions with In) applied to `labels`."""
    matched = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        matched = matched and labels.get(expression["key"]) in expression["values"]
    return matched


def peer_matches(peer: Manifest, policy_namespace: str, pod: Pod) -> bool:
    """Whether one `from`/`to` entry covers `pod` (an ipBlock, or namespace and pod selectors)."""
    if "ipBlock" in peer:
        return ip_address(pod.ip) in ip_network(peer["ipBlock"]["cidr"])
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": pod.namespace}
        in_namespace = selects(peer["namespaceSelector"], namespace_labels)
    else:
        in_namespace = pod.namespace == policy_namespace
    return in_namespace and selects(peer.get("podSelector", {}), pod.labels)


def allowed(
    policies: Sequence[Manifest], direction: str, subject: Pod, other: Pod, port: int | str
) -> bool:
    """Whether the policies isolating `subject` let it talk to `other` (NetworkPolicy rules).

    direction "Ingress": `other` connects to `subject`'s `port`; "Egress": `subject`
    connects to `other`'s. A pod no policy isolates in that direction allows everything.
    """
    isolating = [
        p
        for p in policies
        if p["metadata"]["namespace"] == subject.namespace
        and selects(p["spec"]["podSelector"], subject.labels)
        and direction in p["spec"]["policyTypes"]
    ]
    peers_key = "from" if direction == "Ingress" else "to"
    return not isolating or any(
        any(peer_matches(peer, p["metadata"]["namespace"], other) for peer in rule[peers_key])
        and any(entry["port"] == port for entry in rule["ports"])
        for p in isolating
        for rule in p["spec"].get(direction.lower(), [])
    )


def test_network_policies_isolate_runtime_pods_per_tenant(render: Render) -> None:
    """Runtime pods take `http` and `grpc` from the gateway, `http` from Prometheus, no more."""
    policies = network_policies(render(*NETWORK_POLICY))
    assert sorted(p["metadata"]["namespace"] for p in policies) == [
        "fleetserve-system",
        "ml",
        "search",
    ]
    runtime = runtime_pod("ml")
    for port in ("http", "grpc"):
        assert allowed(policies, "Ingress", runtime, GATEWAY, port), port
    assert allowed(policies, "Ingress", runtime, PROMETHEUS, "http")
    refused = [
        runtime_pod("search"),  # another tenant's model
        Pod("ml", {"app": "notebook"}),  # the same namespace, not the gateway
        Pod("search", PROMETHEUS.labels),  # a tenant's pod posing as Prometheus
        Pod("gateway-canary", GATEWAY.labels),  # a namespace named like the gateway's
    ]
    for source in refused:
        for port in ("http", "grpc"):
            assert not allowed(policies, "Ingress", runtime, source, port), (source, port)
    assert not allowed(policies, "Ingress", runtime, GATEWAY, "debug")


def test_network_policies_confine_the_operator(render: Render, only: Only) -> None:
    """The operator reaches the API server, Prometheus and DNS only; only Prometheus reaches it."""
    manifests = render(*NETWORK_POLICY)
    policies = network_policies(manifests)
    pod = only(manifests, "Deployment")["spec"]["template"]
    operator = Pod("fleetserve-system", pod["metadata"]["labels"])
    assert allowed(policies, "Egress", operator, API_SERVER, 443)
    assert allowed(policies, "Egress", operator, PROMETHEUS, 9090)
    assert allowed(policies, "Egress", operator, DNS, 53)
    refused = [
        (API_SERVER, 10250),
        (runtime_pod("ml"), 8080),  # no tenant endpoint, whatever a spec names
        (Pod("ml", PROMETHEUS.labels), 9090),  # a tenant's fake Prometheus
        (METADATA_SERVICE, 80),
    ]
    for destination, port in refused:
        assert not allowed(policies, "Egress", operator, destination, port), destination
    assert allowed(policies, "Ingress", operator, PROMETHEUS, "metrics")
    assert not allowed(policies, "Ingress", operator, runtime_pod("ml"), "metrics")
    assert not allowed(policies, "Ingress", operator, PROMETHEUS, "health")
    # Each policy selects its own pods only (the runtime pods' egress is their own policy's).
    for policy in policies:
        targets = [
            p
            for p in (operator, runtime_pod("ml"))
            if selects(policy["spec"]["podSelector"], p.labels)
        ]
        assert len(targets) == 1, policy["metadata"]


def test_network_policies_confine_runtime_pods_egress(render: Render) -> None:
    """Runtime pods reach the cluster DNS only: no API server, metadata service or tenant."""
    policies = network_policies(render(*NETWORK_POLICY))
    runtime = runtime_pod("ml")
    assert allowed(policies, "Egress", runtime, DNS, 53)
    refused = [
        (API_SERVER, 443),
        (METADATA_SERVICE, 80),
        (runtime_pod("search"), 8080),  # another tenant's model
        (PROMETHEUS, 9090),
        (Pod("ml", {"app": "notebook"}), 8888),  # its own namespace
        (Pod("default", {}, ip="52.1.2.3"), 443),  # the internet: no model store by default
    ]
    for destination, port in refused:
        assert not allowed(policies, "Egress", runtime, destination, port), destination


def test_a_model_store_opens_runtime_egress_to_it_only(render: Render) -> None:
    """networkPolicy.modelStore: its CIDRs on its ports, nothing else besides DNS."""
    manifests = render(
        *NETWORK_POLICY,
        "--set", "networkPolicy.modelStore.cidrs={10.9.0.0/16}",
        "--set", "networkPolicy.modelStore.ports={443,9000}",
    )  # fmt: skip
    policies = network_policies(manifests)
    runtime = runtime_pod("search")
    store = Pod("storage", {}, ip="10.9.1.2")
    assert allowed(policies, "Egress", runtime, store, 443)
    assert allowed(policies, "Egress", runtime, store, 9000)
    assert not allowed(policies, "Egress", runtime, store, 22)
    assert not allowed(policies, "Egress", runtime, API_SERVER, 443)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            ["--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}"],
            "networkPolicy.runtimeNamespaces",
            id="cluster-wide-without-runtime-namespaces",
        ),
        pytest.param(
            ["--set", "watchNamespaces={ml}"], "networkPolicy.apiServer.cidrs", id="no-api-server"
        ),
    ],
)
def test_network_policy_needs_what_it_cannot_guess(
    values: list[str], message: str, helm: Helm
) -> None:
    """Enabled without the runtime namespaces or the API server's addresses: a clear error."""
    proc = helm("template", "--set", "networkPolicy.enabled=true", *values, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_runtime_namespaces_override_the_watched_ones(render: Render) -> None:
    """A cluster-wide operator gets runtime policies in networkPolicy.runtimeNamespaces."""
    manifests = render(
        "--set", "networkPolicy.enabled=true",
        "--set", "networkPolicy.runtimeNamespaces={ml}",
        "--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
    )  # fmt: skip
    runtime = [m for m in manifests if m["metadata"]["name"] == "fs-fleetserve-runtime"]
    assert [m["metadata"]["namespace"] for m in runtime] == ["ml"]
