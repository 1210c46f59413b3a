"""The chart's high availability: two operator replicas electing a leader through a Lease.

Renders the chart with helm (the `render` fixture, conftest.py) and checks what the operator
and the scheduler will act on: the pod's environment read back by `OperatorConfig` (with the
downward API's values filled in as the kubelet would), the Lease's Role, the spread of the
replicas over nodes, and the PodDisruptionBudget.
"""

from __future__ import annotations

from tests.chart.fixture_types import Helm, Manifest, Only, ReadConfig, Render

NAMESPACE = "fleetserve-system"
POD = {"metadata.name": "fs-fleetserve-6c9d8-x2lqp", "metadata.namespace": NAMESPACE}


def _operator_pod(render: Render, only: Only, *values: str) -> tuple[Manifest, Manifest]:
    deployment = only(render(*values, namespace=NAMESPACE), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def test_two_replicas_elect_a_leader_through_the_lease_by_default(
    render: Render, only: Only, operator_config: ReadConfig
) -> None:
    """Two pods, rolling updates, each a distinct candidate for one Lease in its namespace."""
    deployment, container = _operator_pod(render, only)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    config = operator_config(container, POD)
    assert config.leader_election
    assert config.leader_election_namespace == NAMESPACE
    assert config.leader_election_lease == "fs-fleetserve"
    assert config.pod_name == POD["metadata.name"]
    assert (config.lease_duration_s, config.renew_deadline_s, config.retry_period_s) == (10, 8, 2)


def test_the_lease_role_lets_the_operator_account_create_and_renew_only_its_lease(
    render: Render, only: Only
) -> None:
    manifests = render(namespace=NAMESPACE)
    role = only(manifests, "Role", "fs-fleetserve-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["fs-fleetserve"],
            "verbs": ["get", "update"],
        },
    ]
    binding = only(manifests, "RoleBinding", "fs-fleetserve-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = only(manifests, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
    ]


def test_the_lease_role_is_in_the_release_namespace_for_a_namespaced_install(
    render: Render, only: Only
) -> None:
    """The watched namespaces' RoleBindings do not cover the operator's own namespace."""
    manifests = render("--set", "watchNamespaces={ml}", namespace=NAMESPACE)
    assert only(manifests, "Role")["metadata"]["namespace"] == NAMESPACE


def test_replicas_spread_over_nodes_and_zones_as_a_preference(render: Render, only: Only) -> None:
    deployment, _ = _operator_pod(render, only)
    pod = deployment["spec"]["template"]
    constraints = pod["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    for constraint in constraints:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        assert constraint["maxSkew"] == 1
        selector = constraint["labelSelector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()


def test_a_disruption_budget_keeps_one_operator_through_drains(render: Render, only: Only) -> None:
    manifests = render(namespace=NAMESPACE)
    budget = only(manifests, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_one_replica_gets_no_disruption_budget(render: Render) -> None:
    """A budget of one available pod over a single pod would block every node drain."""
    kinds = {m["kind"] for m in render("--set", "replicas=1")}
    assert "PodDisruptionBudget" not in kinds


def test_without_leader_election_one_replica_runs_with_recreate(
    render: Render, only: Only, operator_config: ReadConfig
) -> None:
    values = ("--set", "replicas=1,leaderElection.enabled=false")
    deployment, container = _operator_pod(render, only, *values)
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not operator_config(container, POD).leader_election
    assert "Role" not in {m["kind"] for m in render(*values)}


def test_lease_timings_that_could_let_two_operators_lead_are_refused(helm: Helm) -> None:
    for bad in ("leaderElection.renewDeadlineSeconds=10", "leaderElection.retryPeriodSeconds=8"):
        proc = helm("template", "--set", bad, check=False)
        assert proc.returncode != 0, bad
        assert "retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds" in proc.stderr
