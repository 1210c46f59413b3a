"""The chart's runtime images: values → the operator's env → OperatorConfig → the pods it renders.

Renders the chart with helm (the `render` fixture, conftest.py), reads the operator
container's environment back with `OperatorConfig`, as the operator does at start-up, and runs
one reconcile of a service that names no image with the reconciler the operator builds.
"""

from __future__ import annotations

import pytest

from fleetserve_operator import __main__ as entry
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.settings import OperatorConfig
from fleetserve_operator.spec import RuntimeImages
from fleetserve_operator.testing import FakeKube, make_service
from tests.chart.fixture_types import Only, ReadConfig, Render

REPOSITORY = "ghcr.io/fleetserve/fleetserve-runtime"
PINNED = "sha256:" + "a" * 64


def _config(
    render: Render, only: Only, operator_config: ReadConfig, *values: str
) -> OperatorConfig:
    """The OperatorConfig the operator pod of the chart rendered with `values` starts with."""
    (container,) = only(render(*values), "Deployment")["spec"]["template"]["spec"]["containers"]
    return operator_config(container)


def test_the_chart_defaults_are_the_operators_built_in_images(
    render: Render, only: Only, operator_config: ReadConfig
) -> None:
    """Default values: the release's two builds, as the operator itself would pick them."""
    assert _config(render, only, operator_config).runtime_images == RuntimeImages()


@pytest.mark.parametrize(
    ("values", "gpu", "cpu"),
    [
        pytest.param(
            "runtime.image.tag=0.2.0", f"{REPOSITORY}:0.2.0", f"{REPOSITORY}:0.2.0-cpu",
            id="a-new-tag-moves-both-tracks",
        ),
        pytest.param(
            "runtime.image.repository=mirror.example/rt",
            "mirror.example/rt:0.1.0", "mirror.example/rt:0.1.0-cpu",
            id="a-mirror-serves-both-tracks",
        ),
        pytest.param(
            f"runtime.image.digest={PINNED},runtime.cpuImage.digest={PINNED}",
            f"{REPOSITORY}@{PINNED}", f"{REPOSITORY}@{PINNED}",
            id="digests-win-over-tags",
        ),
        pytest.param(
            f"runtime.image.digest={PINNED}", f"{REPOSITORY}@{PINNED}", f"{REPOSITORY}:0.1.0-cpu",
            id="a-digest-pins-one-image-only",
        ),
        pytest.param(
            "runtime.cpuImage.repository=cpu.example/rt,runtime.cpuImage.tag=v9",
            f"{REPOSITORY}:0.1.0", "cpu.example/rt:v9",
            id="a-cpu-image-of-its-own",
        ),
    ],
)  # fmt: skip
def test_runtime_values_set_the_operators_default_images(
    render: Render, only: Only, operator_config: ReadConfig, values: str, gpu: str, cpu: str
) -> None:
    """runtime.image and runtime.cpuImage become FLEETSERVE_RUNTIME_IMAGE and _CPU_IMAGE."""
    config = _config(render, only, operator_config, "--set", values)
    assert config.runtime_images == RuntimeImages(gpu=gpu, cpu=cpu)


def test_the_chart_values_reach_the_pods_of_a_service_naming_no_image(
    render: Render, only: Only, operator_config: ReadConfig
) -> None:
    """The operator the chart configures runs its images on the GPU and fallback tracks."""
    config = _config(render, only, operator_config, "--set", "runtime.image.tag=0.2.0")
    kube = FakeKube()
    model = {"name": "demo", "version": "1", "uri": "builtin://synthetic"}
    kube.add_service(make_service({"model": model, "fallback": {"enabled": True}}))
    sync = entry._reconciler(config, OperatorMetrics(), kube)
    assert sync.run_by_name("ns", "demo", trigger="test") is None
    images = {
        name: body["spec"]["template"]["spec"]["containers"][0]["image"]
        for (kind, _, name), body in kube.objects.items()
        if kind == "Deployment"
    }
    assert images == {
        "demo-stable": f"{REPOSITORY}:0.2.0",
        "demo-fallback": f"{REPOSITORY}:0.2.0-cpu",
    }
