"""The rollout wired into a reconcile: facts in, children rendered from status, effects out."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_operator import analysis, naming, observe
from fleetserve_operator.analysis import SERVER_ERRORS
from fleetserve_operator.controller.metrics import (
    CANARY_WEIGHT,
    EFFECTIVE_CANARY_WEIGHT,
    INFO,
    PHASE,
    OperatorMetrics,
    ServiceGauge,
)
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.rollout import OperatorCounter
from fleetserve_operator.spec import (
    DEFAULT_CPU_IMAGE,
    DEFAULT_IMAGE,
    ConditionType,
    InferenceServiceStatus,
    RuntimeImages,
)
from fleetserve_operator.testing import FakeClock, FakeKube, FakeMetricSource, make_service

GATEWAY = {"provider": "gateway-api", "parentRefs": [{"name": "gw"}]}
CONFIGURED = RuntimeImages(gpu="registry.example/rt:2", cpu="registry.example/rt:2-cpu")


def _spec(version: str = "1", **sections: Any) -> dict[str, Any]:
    return {
        "model": {"name": "demo", "version": version, "uri": "builtin://synthetic"},
        "rollout": {"steps": [50, 100], "interval": "10s"},
        "traffic": GATEWAY,
        **sections,
    }


class Cluster:
    """A FakeKube with one InferenceService, a Sync on a FakeClock, and shortcuts."""

    def __init__(self, spec: dict[str, Any], source: FakeMetricSource | None = None) -> None:
        self.kube = FakeKube()
        self.kube.add_service(make_service(spec))
        self.clock = FakeClock()
        self.metrics = OperatorMetrics()
        self.source = source
        self.restart(RuntimeImages())

    def restart(self, images: RuntimeImages) -> None:
        """Run the operator anew (as after a `helm upgrade`), with these default images."""
        source = self.source
        self.sync = Sync(
            self.kube,
            metrics=self.metrics,
            clock=lambda: self.clock.now,
            default_prometheus_url="http://prom:9090" if source else None,
            metric_source=lambda url: source or FakeMetricSource(),
            images=images,
        )

    def reconcile(self, *, after_s: float = 0.0) -> InferenceServiceStatus:
        """One reconcile, `after_s` seconds later; returns the status written."""
        self.clock.advance(after_s)
        assert self.sync.run_by_name("ns", "demo", trigger="test") is None
        return self.kube.status_of("ns", "demo")

    def ready(self, *names: str) -> InferenceServiceStatus:
        """Play the Deployment controller for `names`, then reconcile."""
        for name in names:
            self.kube.set_ready(name)
        return self.reconcile()

    def edit(self, **spec: Any) -> None:
        """Replace the spec (a new generation)."""
        body = self.kube.objects[(naming.KIND, "ns", "demo")]
        body["spec"] = spec
        body["metadata"]["generation"] += 1

    def deployment(self, name: str) -> dict[str, Any] | None:
        """The stored Deployment `name`, if any."""
        return self.kube.objects.get(("Deployment", "ns", name))

    def version(self, name: str) -> str:
        """The model version of Deployment `name`'s pod template."""
        deployment = self.deployment(name)
        assert deployment is not None
        labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
        return labels[naming.MODEL_VERSION_LABEL]

    def image(self, name: str) -> str:
        """The runtime container's image in Deployment `name`'s pod template."""
        deployment = self.deployment(name)
        assert deployment is not None
        image: str = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        return image

    def weights(self) -> dict[str, int]:
        """The HTTPRoute's weight per backend."""
        route = self.kube.objects[("HTTPRoute", "ns", "demo")]
        refs = route["spec"]["rules"][0]["backendRefs"]
        return {ref["name"]: ref["weight"] for ref in refs}

    def gauge(self, gauge: ServiceGauge, **labels: str) -> float | None:
        """The service's sample of `gauge` with `labels`, None when not exported."""
        labels = {"namespace": "ns", "name": "demo", **labels}
        return self.metrics.registry.get_sample_value(gauge.name, labels)

    def counter(self, counter: OperatorCounter, reason: str) -> float:
        """The operator counter's value for `reason`."""
        value = self.metrics.registry.get_sample_value(counter.value, {"reason": reason})
        return value or 0.0


def _running(spec: dict[str, Any], source: FakeMetricSource | None = None) -> Cluster:
    """A service whose stable track serves version 1."""
    cluster = Cluster(spec, source)
    cluster.reconcile()
    assert cluster.ready("demo-stable").phase == "Succeeded"
    return cluster


def _started(source: FakeMetricSource | None = None, **sections: Any) -> Cluster:
    """Version 2 applied to a running service: its canary exists and is Ready."""
    cluster = _running(_spec(**sections), source)
    cluster.edit(**_spec("2", **sections))
    assert cluster.reconcile().phase == "Starting"
    return cluster


def test_first_deploy_adopts_the_spec_as_stable() -> None:
    """The first spec becomes stable's, labelled with its hash; no canary."""
    cluster = _running(_spec())
    status = cluster.reconcile()
    assert status.stable_version == "1"
    stable = cluster.deployment("demo-stable")
    assert stable is not None
    label = stable["metadata"]["labels"][naming.SPEC_HASH_LABEL]
    assert label == status.rollout.stable_hash
    assert stable["spec"]["template"]["metadata"]["labels"][naming.SPEC_HASH_LABEL] == label
    assert cluster.deployment("demo-canary") is None
    assert cluster.weights() == {"demo-stable": 100}


def test_new_version_runs_as_canary_and_stable_stays() -> None:
    """A spec change creates the canary at weight 0; stable keeps serving version 1."""
    cluster = _started()
    assert cluster.version("demo-stable") == "1"
    assert cluster.version("demo-canary") == "2"
    assert ("Service", "ns", "demo-canary") in cluster.kube.objects
    assert cluster.weights() == {"demo-stable": 100, "demo-canary": 0}


def _args(cluster: Cluster, name: str) -> list[str]:
    """The runtime container's args in Deployment `name`'s pod template."""
    deployment = cluster.deployment(name)
    assert deployment is not None
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_backend_change_runs_as_canary_and_stable_keeps_its_backend() -> None:
    """A new runtime.backend at the same version is a rollout: only the canary gets the flag."""
    cluster = _running(_spec())
    cluster.edit(**_spec(runtime={"backend": "torch"}))
    assert cluster.reconcile().phase == "Starting"
    assert "--backend=torch" in _args(cluster, "demo-canary")
    assert not [arg for arg in _args(cluster, "demo-stable") if arg.startswith("--backend")]


def test_fallback_backend_change_replaces_the_fallback_pods_without_a_rollout() -> None:
    """fallback.backend, like fallback.precision, re-renders the fallback and starts no canary."""
    cluster = _running(_spec(fallback={"enabled": True}))
    stable_before = _args(cluster, "demo-stable")
    cluster.edit(**_spec(fallback={"enabled": True, "backend": "torch"}))
    assert cluster.reconcile().phase == "Succeeded"
    assert "--backend=torch" in _args(cluster, "demo-fallback")
    assert cluster.deployment("demo-canary") is None
    assert _args(cluster, "demo-stable") == stable_before


def test_a_new_default_gpu_image_rolls_out_through_the_canary() -> None:
    """A new default under a spec that names no image is a rollout, like a new image.

    The canary runs the new image while stable keeps the old one until the promotion.
    """
    cluster = _running(_spec())
    assert cluster.image("demo-stable") == DEFAULT_IMAGE
    cluster.restart(CONFIGURED)
    status = cluster.reconcile()
    assert status.phase == "Starting"
    assert (cluster.image("demo-stable"), cluster.image("demo-canary")) == (
        DEFAULT_IMAGE,
        CONFIGURED.gpu,
    )
    assert status.tracks.stable is not None
    assert status.tracks.canary is not None
    assert (status.tracks.stable.image, status.tracks.canary.image) == (
        DEFAULT_IMAGE,
        CONFIGURED.gpu,
    )
    assert cluster.ready("demo-canary").canary_weight == 50
    assert cluster.reconcile(after_s=10).canary_weight == 100
    assert cluster.reconcile(after_s=10).phase == "Promoting"
    assert cluster.image("demo-stable") == CONFIGURED.gpu
    assert cluster.ready("demo-stable").phase == "Succeeded"
    assert cluster.deployment("demo-canary") is None


def test_a_named_image_does_not_follow_the_default() -> None:
    """A spec that names its images keeps them, and starts no rollout, when the default moves."""
    named = {"runtime": {"image": "mine/rt:7"}, "fallback": {"enabled": True, "image": "mine/c:7"}}
    cluster = _running(_spec(**named))
    cluster.restart(CONFIGURED)
    assert cluster.reconcile().phase == "Succeeded"
    assert cluster.deployment("demo-canary") is None
    assert (cluster.image("demo-stable"), cluster.image("demo-fallback")) == (
        "mine/rt:7",
        "mine/c:7",
    )


def test_a_new_default_cpu_image_replaces_the_fallback_pods_without_a_rollout() -> None:
    """The fallback runs the CPU default, never the GPU image; a new one replaces its pods."""
    cluster = _running(_spec(fallback={"enabled": True}))
    assert cluster.image("demo-fallback") == DEFAULT_CPU_IMAGE
    cluster.restart(RuntimeImages(cpu=CONFIGURED.cpu))
    status = cluster.reconcile()
    assert status.phase == "Succeeded"
    assert cluster.image("demo-fallback") == CONFIGURED.cpu
    assert status.tracks.fallback is not None
    assert status.tracks.fallback.image == CONFIGURED.cpu
    assert cluster.image("demo-stable") == DEFAULT_IMAGE
    assert cluster.deployment("demo-canary") is None


def test_healthy_canary_is_promoted_through_every_step() -> None:
    """Ready canary → 50% → 100% → stable rolls to version 2 → canary gone, counted once."""
    cluster = _started()
    status = cluster.ready("demo-canary")
    assert (status.phase, status.canary_weight) == ("Progressing", 50)
    assert cluster.weights() == {"demo-stable": 50, "demo-canary": 50}
    assert cluster.reconcile(after_s=5).canary_weight == 50  # the step is not due yet
    assert cluster.reconcile(after_s=5).canary_weight == 100
    assert cluster.weights() == {"demo-stable": 0, "demo-canary": 100}
    status = cluster.reconcile(after_s=10)
    assert status.phase == "Promoting"
    assert cluster.version("demo-stable") == "2"
    status = cluster.ready("demo-stable")
    assert (status.phase, status.stable_version) == ("Succeeded", "2")
    assert cluster.deployment("demo-canary") is None
    assert cluster.weights() == {"demo-stable": 100}
    cluster.reconcile(after_s=60)
    assert cluster.counter(OperatorCounter.PROMOTIONS, "Promoted") == 1
    assert any(e.reason == "Promoted" for e in cluster.kube.events)


def test_progressing_holds_while_a_canary_waits_at_a_step() -> None:
    """Every Deployment is rolled out at a step, yet Progressing stays True until promotion."""
    cluster = _started()
    cluster.ready("demo-canary")
    progressing = cluster.reconcile(after_s=1).condition(ConditionType.PROGRESSING)
    assert progressing is not None
    assert (progressing.status, progressing.reason) == ("True", "Progressing")
    assert progressing.message == "canary 2 at the 50% step"
    cluster.reconcile(after_s=10)
    cluster.reconcile(after_s=10)
    done = cluster.ready("demo-stable").condition(ConditionType.PROGRESSING)
    assert done is not None
    assert (done.status, done.reason) == ("False", "Complete")


@pytest.mark.parametrize(
    ("traffic", "effective"),
    [
        # The route sends exactly the step's 50%.
        pytest.param(GATEWAY, 50, id="gateway-api"),
        # The Service spreads over ready pods: 2 canary next to 3 stable is 40%.
        pytest.param({"provider": "replicas"}, 40, id="replicas"),
    ],
)
def test_effective_weight_is_what_the_canary_really_gets(
    traffic: dict[str, Any], effective: int
) -> None:
    """`effectiveCanaryWeight` (and its gauge) says what the canary receives, step or not."""
    three = {"replicas": {"min": 3, "max": 3}}
    cluster = _started(traffic=traffic, runtime=three)
    assert cluster.ready("demo-canary").canary_weight == 50
    status = cluster.ready("demo-canary", "demo-stable")
    assert (status.canary_weight, status.effective_canary_weight) == (50, effective)
    assert cluster.gauge(EFFECTIVE_CANARY_WEIGHT) == effective


def test_restarting_canary_is_rolled_back() -> None:
    """A canary pod that restarted: weight 0, canary deleted, RolledBack, counter, Warning."""
    cluster = _started()
    cluster.ready("demo-canary")
    cluster.kube.add_pod("demo-canary", restarts=1)
    status = cluster.reconcile()
    assert (status.phase, status.canary_weight) == ("RolledBack", 0)
    assert cluster.deployment("demo-canary") is None
    assert cluster.version("demo-stable") == "1"
    assert cluster.weights() == {"demo-stable": 100}
    assert cluster.counter(OperatorCounter.ROLLBACKS, "CanaryRestarted") == 1
    assert any(e.type == "Warning" and e.reason == "RolledBack" for e in cluster.kube.events)


def test_gauges_follow_the_steps_and_the_rollback() -> None:
    """The weight gauge holds each step's weight, then 0 with the phase RolledBack."""
    cluster = _started()
    assert cluster.gauge(PHASE, phase="Starting") == 1
    cluster.ready("demo-canary")
    assert cluster.gauge(CANARY_WEIGHT) == 50
    assert cluster.gauge(INFO, stable_version="1", canary_version="2") == 1
    cluster.kube.add_pod("demo-canary", restarts=1)
    cluster.reconcile()
    assert cluster.gauge(CANARY_WEIGHT) == 0
    assert cluster.gauge(PHASE, phase="RolledBack") == 1
    assert cluster.gauge(PHASE, phase="Progressing") == 0


def test_failing_analysis_rolls_back() -> None:
    """Due analyses query the canary's series; two failed ones withdraw the canary."""
    source = FakeMetricSource({"fleetserve_requests_total": 100.0})
    knobs = {"steps": [50, 100], "interval": "10s",
             "analysis": {"prometheusUrl": "http://prom:9090", "failureThreshold": 2,
                          "mode": "threshold"}}  # fmt: skip
    cluster = _started(source, rollout=knobs)
    cluster.ready("demo-canary")
    status = cluster.reconcile(after_s=10)
    assert status.rollout.failed_analyses == 1
    assert any('track="canary"' in query for query in source.queries)
    status = cluster.reconcile(after_s=10)
    assert status.phase == "RolledBack"
    assert cluster.counter(OperatorCounter.ROLLBACKS, "AnalysisFailed") == 1


def test_command_annotation_is_acted_on_and_removed() -> None:
    """`promote=full` promotes at once; it is acknowledged in status and then removed."""
    cluster = _started()
    cluster.ready("demo-canary")
    body = cluster.kube.objects[(naming.KIND, "ns", "demo")]
    body["metadata"]["annotations"] = {"serving.fleetserve.io/promote": "full"}
    status = cluster.reconcile()
    assert status.phase == "Promoting"
    assert [a.value for a in status.rollout.acknowledged] == ["full"]
    assert body["metadata"]["annotations"] == {}


def test_stable_without_replicas_fails_over_to_the_cpu_track() -> None:
    """Stable unavailable: FallbackActive, the route sends all to the fallback, and back."""
    cluster = _running(_spec(fallback={"enabled": True}))
    cluster.ready("demo-fallback")
    cluster.kube.set_ready("demo-stable", ready=0)
    status = cluster.reconcile()
    condition = status.condition(ConditionType.FALLBACK_ACTIVE)
    assert condition is not None
    assert (condition.status, condition.reason) == ("True", "StableUnavailable")
    assert cluster.weights() == {"demo-stable": 0, "demo-fallback": 100}
    status = cluster.ready("demo-stable")
    condition = status.condition(ConditionType.FALLBACK_ACTIVE)
    assert condition is not None
    assert condition.status == "False"
    assert cluster.weights() == {"demo-stable": 100, "demo-fallback": 0}


def test_stable_error_ratio_is_read_for_the_fallback_trigger() -> None:
    """With fallback.maxErrorRate, the stable track's 5xx ratio is queried and can fail over."""
    source = FakeMetricSource()
    spec = _spec(fallback={"enabled": True, "maxErrorRate": 0.1, "errorWindow": "30s"})
    cluster = _running(spec, source)
    source.values['track="stable",code=~"5.."'] = 0.9
    status = cluster.reconcile()
    condition = status.condition(ConditionType.FALLBACK_ACTIVE)
    assert condition is not None
    assert condition.reason == "StableErrorRate"
    scope = analysis.TrackScope("ns", "demo", "1", naming.Track.STABLE)
    assert analysis.code_ratio_query(scope, "30s", SERVER_ERRORS) in source.queries


@pytest.mark.parametrize(
    ("pod_hash", "restarts", "reason", "expected"),
    [
        pytest.param("h1", 2, "OOMKilled", (2, True), id="current-template"),
        pytest.param("h0", 2, "OOMKilled", (0, False), id="older-template-ignored"),
    ],
)
def test_track_facts_count_pods_of_the_current_template(
    pod_hash: str, restarts: int, reason: str, expected: tuple[int, bool]
) -> None:
    """Restarts and OOM kills count only on pods whose spec hash is the Deployment's."""
    labels = {naming.TRACK_LABEL: "canary", naming.SPEC_HASH_LABEL: "h1"}
    deployment = {
        "metadata": {"labels": labels, "generation": 1},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "availableReplicas": 1},
    }  # fmt: skip
    pod = {
        "metadata": {"labels": {**labels, naming.SPEC_HASH_LABEL: pod_hash}},
        "status": {"containerStatuses": [{"restartCount": restarts,
                   "lastState": {"terminated": {"reason": reason}}}]},
    }  # fmt: skip
    found = observe.track_facts(deployment, [pod])
    assert found is not None
    assert (found.restarts, found.oom_killed) == expected
    assert (found.spec_hash, found.available, found.rolled_out) == ("h1", 1, True)
