"""`helm install` of charts/fleetserve on the local control plane: the operator runs from it.

The real API server validates every object (the CRD's structural schema, RBAC, the
Deployment). The harness's fake kubelet runs the operator pod as a local process: the image's
entrypoint with the chart's args and env, its ports mapped to free loopback ports, and a
kubeconfig holding only a token of the chart's ServiceAccount bound to the pod (see
fleetserve_e2e/pod_launch.py and identity.py). So `helm install --wait` waits for the real
operator's /healthz, and the operator reconciles under exactly the chart's RBAC: one test has
it turn an InferenceService into runtime pods that really run. Each test installs a release of
its own into its namespace and uninstalls it, cluster-scoped RBAC included; the CRD stays, as
Helm leaves CRDs in place.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetserve_e2e import KubeClient, LocalCluster, LocalPrometheus
from fleetserve_e2e.helm import helm
from fleetserve_e2e.operator_process import (
    CRD_NAME,
    RBAC_API,
    ROLE,
    child_path,
    condition,
    fsvc_path,
)
from fleetserve_e2e.testing import assert_operator_log_clean, list_pods, wait_for_deletion
from fleetserve_e2e.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fleetserve"
EXAMPLE = ROOT / "examples" / "synthetic.yaml"
NETWORKING_API = "/apis/networking.k8s.io/v1"
PROMETHEUS_URL_FIELD = "spec.rollout.analysis.prometheusUrl"

# Install, a runtime pod that imports torch, deletion and uninstall: more than the default
# per-test timeout on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(420)


@pytest.fixture
def release(
    local_cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """The chart installed as release `fs-<namespace's random suffix>`, values from the param.

    `{namespace}` in a value stands for the test's namespace, `{prometheus}` for the session's
    Prometheus (started only for a release that names it).
    """
    name = f"fs-{namespace[-5:]}"
    values = [v.replace("{namespace}", namespace) for v in getattr(request, "param", [])]
    if any("{prometheus}" in v for v in values):
        prometheus: LocalPrometheus = request.getfixturevalue("local_prometheus")
        values = [v.replace("{prometheus}", prometheus.url) for v in values]
    installed = helm(
        local_cluster, tmp_path, "install", name, str(CHART), "-n", namespace,
        "--wait", "--timeout", "150s", *values,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert "kubectl get inferenceservices" in installed.stdout, "NOTES.txt did not render"
    yield name
    removed = helm(local_cluster, tmp_path, "uninstall", name, "-n", namespace, "--wait")
    assert removed.returncode == 0, removed.stderr


def installed_with(case: str, *values: str) -> pytest.MarkDecorator:
    """Give the test a `release` installed with these helm flags, under the test id `case`."""
    return pytest.mark.parametrize("release", [pytest.param(list(values), id=case)], indirect=True)


def chart_fullname(release: str) -> str:
    """`fleetserve.fullname`, the operator objects' name, for a release not named for the chart."""
    return f"{release}-fleetserve"


def operator_account(namespace: str, release: str) -> str:
    """The operator's ServiceAccount as a user name, for `kubectl --as`."""
    return f"system:serviceaccount:{namespace}:{chart_fullname(release)}"


def shipped_rules() -> list[dict[str, object]]:
    """The rules of operator/rbac/role.yaml's ClusterRole."""
    (role,) = [d for d in yaml.safe_load_all(ROLE.read_text()) if d["kind"] == "ClusterRole"]
    rules: list[dict[str, object]] = role["rules"]
    return rules


def can_i(cluster: LocalCluster, account: str, verb: str, resource: str, namespace: str) -> str:
    """`kubectl auth can-i` as the chart's ServiceAccount: "yes" or "no"."""
    answer = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={account}")
    return answer.stdout.strip()


def test_install_creates_valid_objects(
    local_cluster: LocalCluster, kube: KubeClient, namespace: str, release: str
) -> None:
    """CRD Established, operator run and Available, RBAC identical to role.yaml and effective."""
    crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    fullname = chart_fullname(release)
    deployment = kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}")
    # Two replicas by default: a leader and a standby waiting for the Lease.
    assert deployment["status"]["availableReplicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == fullname
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{fullname}")
    kube.get(f"/api/v1/namespaces/{namespace}/services/{fullname}-metrics")
    kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{fullname}-dashboard")
    role = kube.get(f"{RBAC_API}/clusterroles/{fullname}")
    assert role["rules"] == shipped_rules()
    account = operator_account(namespace, release)
    assert can_i(local_cluster, account, "patch", "deployments.apps", namespace) == "yes"
    assert can_i(local_cluster, account, "get", "secrets", namespace) == "no"
    assert_operator_ran_cleanly(local_cluster, namespace, release)


@installed_with("watch-default", "--set", "watchNamespaces={default}")
def test_namespaced_install_grants_only_the_watched_namespace(
    local_cluster: LocalCluster, kube: KubeClient, namespace: str, release: str
) -> None:
    """With watchNamespaces, the rules apply in the watched namespace and nowhere else."""
    fullname = chart_fullname(release)
    account = operator_account(namespace, release)
    kube.get(f"{RBAC_API}/namespaces/default/rolebindings/{fullname}")
    assert can_i(local_cluster, account, "patch", "deployments.apps", "default") == "yes"
    assert can_i(local_cluster, account, "patch", "deployments.apps", namespace) == "no"
    assert can_i(local_cluster, account, "list", "customresourcedefinitions", "default") == "yes"


def assert_operator_ran_cleanly(cluster: LocalCluster, namespace: str, release: str) -> None:
    """The release's operator pods really ran, and were refused nothing and raised nothing.

    The fake kubelet keeps each pod's log in `<work dir>/pods/<namespace>_<pod>.log`. Both
    replicas run (one leads, one stands by); every log must be clean.
    """
    selector = f"app.kubernetes.io/name=fleetserve-operator,app.kubernetes.io/instance={release}"
    pods = list_pods(cluster.client, namespace, selector)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        path = cluster.work_dir / "pods" / f"{namespace}_{pod['metadata']['name']}.log"
        log = path.read_text(encoding="utf-8", errors="replace")
        assert log, f"{path} is empty: no operator process ran"
        assert_operator_log_clean(log, str(path))


@installed_with("watch-own", "--set", "watchNamespaces[0]={namespace}")
def test_chart_operator_reconciles_an_inference_service(
    local_cluster: LocalCluster, kube: KubeClient, namespace: str, release: str
) -> None:
    """The chart's operator turns the synthetic example into running, Ready runtime pods.

    It runs as the chart's ServiceAccount only, so this also proves the chart's RBAC suffices:
    its log may hold no "forbidden" and no traceback. The InferenceService is deleted while the
    operator still runs, as the operator has to remove its finalizer.
    """
    service = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    # One replica is enough to prove the pods run, and keeps the test quick.
    service["spec"]["runtime"]["replicas"] = {"min": 1, "max": 1}
    name = service["metadata"]["name"]
    kube.create(fsvc_path(namespace), service)

    def is_ready() -> bool:
        status = kube.get(fsvc_path(namespace, name)).get("status", {})
        return bool(condition(status, "Ready")["status"] == "True")

    wait_until(is_ready, timeout_s=150.0, what=f"{namespace}/{name} to be Ready")
    stable = kube.get(child_path("Deployment", namespace, f"{name}-stable"))
    assert stable["status"]["readyReplicas"] == 1
    # Ready pods here are processes that answered their readiness probe.
    assert [p.ready for p in local_cluster.pod_addresses() if p.namespace == namespace] == [True]
    kube.delete(fsvc_path(namespace, name))
    wait_for_deletion(kube, fsvc_path(namespace, name), timeout_s=60.0)
    assert_operator_ran_cleanly(local_cluster, namespace, release)


def example_service(name: str, prometheus_url: str) -> dict[str, object]:
    """The synthetic example, one replica, with a memory budget checked against `prometheus_url`.

    The budget makes every reconcile read the runtime's memory figures from that Prometheus,
    so the operator's allowlist decides on each one.
    """
    service = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    service["metadata"]["name"] = name
    service["spec"]["runtime"]["replicas"] = {"min": 1, "max": 1}
    service["spec"]["memory"] = {"budget": "1Gi"}
    service["spec"]["rollout"]["analysis"] = {"prometheusUrl": prometheus_url}
    return service


def selector_of(policy: dict[str, object]) -> str:
    """A NetworkPolicy's podSelector (matchLabels only) as a label selector string."""
    spec = policy["spec"]
    assert isinstance(spec, dict)
    match_labels: dict[str, str] = spec["podSelector"]["matchLabels"]
    return ",".join(f"{key}={value}" for key, value in match_labels.items())


@installed_with(
    "tenancy",
    "--set", "watchNamespaces[0]={namespace}",
    "--set", "networkPolicy.enabled=true",
    "--set", "networkPolicy.gatewayNamespaces[0]=default",
    "--set", "networkPolicy.apiServer.cidrs[0]=127.0.0.1/32",
    "--set-json", 'operator.allowedPrometheusUrls=["{prometheus}"]',
)  # fmt: skip
def test_tenancy_values_reach_the_cluster_and_the_operator(
    local_cluster: LocalCluster,
    local_prometheus: LocalPrometheus,
    kube: KubeClient,
    namespace: str,
    release: str,
) -> None:
    """NetworkPolicies valid and aimed right; only the allowlisted Prometheus is queried.

    The operator serves the service naming the allowlisted Prometheus and refuses the other,
    naming the field. No CNI runs here, so nothing enforces the policies: tests/chart judges
    what they let through. What only a cluster can tell is told here: the objects are valid,
    and their selectors pick exactly the operator pod and the runtime pods it creates.
    """
    kube.create(fsvc_path(namespace), example_service("inside", local_prometheus.url))
    kube.create(fsvc_path(namespace), example_service("outside", "http://127.0.0.1:9"))

    def ready(name: str) -> bool:
        status = kube.get(fsvc_path(namespace, name)).get("status", {})
        return bool(condition(status, "Ready")["status"] == "True")

    def refused() -> dict[str, object] | None:
        status = kube.get(fsvc_path(namespace, "outside")).get("status", {})
        found = condition(status, "Degraded")
        return found if found["status"] == "True" else None

    wait_until(lambda: ready("inside"), timeout_s=150.0, what=f"{namespace}/inside to be Ready")
    reported = wait_until(refused, timeout_s=60.0, what=f"{namespace}/outside refused")
    assert reported["reason"] == "InvalidSpec"
    assert PROMETHEUS_URL_FIELD in str(reported["message"])

    fullname = chart_fullname(release)
    policies = f"{NETWORKING_API}/namespaces/{namespace}/networkpolicies"
    operator_policy = kube.get(f"{policies}/{fullname}-operator")
    runtime_policy = kube.get(f"{policies}/{fullname}-runtime")
    operator_pods = list_pods(local_cluster.client, namespace, selector_of(operator_policy))
    assert {p["metadata"]["labels"]["app.kubernetes.io/instance"] for p in operator_pods} == {
        release
    }
    runtime_pods = list_pods(local_cluster.client, namespace, selector_of(runtime_policy))
    owners = {p["metadata"]["labels"]["app.kubernetes.io/instance"] for p in runtime_pods}
    assert owners == {"inside"}

    for name in ("inside", "outside"):
        kube.delete(fsvc_path(namespace, name))
    for name in ("inside", "outside"):
        wait_for_deletion(kube, fsvc_path(namespace, name), timeout_s=60.0)
    assert_operator_ran_cleanly(local_cluster, namespace, release)


def _deployment(pod: dict[str, object]) -> dict[str, object]:
    """A Deployment of one `busybox` container, its pod spec updated with `pod`."""
    spec: dict[str, object] = {"containers": [{"name": "runtime", "image": "busybox"}], **pod}
    labels = {"app": "probe"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "probe"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


PRIVILEGED = {"containers": [{"name": "sidecar", "image": "busybox",
                              "securityContext": {"privileged": True}}]}  # fmt: skip
HOST_PATH = {"volumes": [{"name": "host-root", "hostPath": {"path": "/"}}]}


# Pod specs no InferenceService makes, and what the API server says of each.
DANGEROUS = [
    ({"hostNetwork": True}, "spec.template.spec.hostNetwork is true"),
    ({"hostPID": True}, "spec.template.spec.hostPID is true"),
    ({"hostIPC": True}, "spec.template.spec.hostIPC is true"),
    (PRIVILEGED, "container sidecar has securityContext.privileged true"),
    (HOST_PATH, "volume host-root is a hostPath (/)"),
    ({"serviceAccountName": "cluster-admin-sa"},
     "spec.template.spec.serviceAccountName cluster-admin-sa is not one"),
]  # fmt: skip


def test_the_operator_account_cannot_write_a_dangerous_deployment(
    local_cluster: LocalCluster, namespace: str, release: str, tmp_path: Path
) -> None:
    """The chart's admission policy refuses it for the operator's account, naming the field.

    The same Deployment from another account (the admin) is not the policy's business, and a
    plain one from the operator's account passes: the policy takes no right the operator uses.
    """
    account = operator_account(namespace, release)
    manifest = tmp_path / "deployment.yaml"

    def create(body: dict[str, object], *identity: str) -> subprocess.CompletedProcess[str]:
        manifest.write_text(yaml.safe_dump(body), encoding="utf-8")
        return local_cluster.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-f", str(manifest), *identity
        )

    for pod, message in DANGEROUS:
        refused = create(_deployment(pod), f"--as={account}")
        assert refused.returncode != 0, pod
        assert message in refused.stderr, refused.stderr
        assert create(_deployment(pod)).returncode == 0, pod
    plain = create(_deployment({}), f"--as={account}")
    assert plain.returncode == 0, plain.stderr
