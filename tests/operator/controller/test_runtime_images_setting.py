"""The operator's default runtime images: read from FLEETSERVE_*, handed to every reconcile.

`FLEETSERVE_RUNTIME_IMAGE` and `FLEETSERVE_RUNTIME_CPU_IMAGE` (the chart's `runtime.image`
and `runtime.cpuImage`) reach the pods of the services whose spec names no image.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleetserve_operator import __main__ as entry
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.settings import OperatorConfig
from fleetserve_operator.spec import RuntimeImages
from fleetserve_operator.testing import FakeKube, make_service

VARIABLES = ("FLEETSERVE_RUNTIME_IMAGE", "FLEETSERVE_RUNTIME_CPU_IMAGE")
MODEL = {"name": "demo", "version": "1", "uri": "builtin://synthetic"}


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _images_of_pods(config: OperatorConfig, spec: dict[str, object]) -> dict[str, str]:
    """{Deployment: its runtime container's image} after one reconcile under `config`."""
    kube = FakeKube()
    kube.add_service(make_service(spec))
    assert (
        entry._reconciler(config, OperatorMetrics(), kube).run_by_name("ns", "demo", trigger="t")
        is None
    )
    return {
        name: body["spec"]["template"]["spec"]["containers"][0]["image"]
        for (kind, _, name), body in kube.objects.items()
        if kind == "Deployment"
    }


def test_without_settings_the_operator_runs_the_built_in_images() -> None:
    """Nothing configured: the built-in GPU and CPU-track images."""
    assert OperatorConfig().runtime_images == RuntimeImages()


def test_the_variables_set_the_default_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each variable sets its track's default, the other keeps the built-in one."""
    monkeypatch.setenv("FLEETSERVE_RUNTIME_CPU_IMAGE", "mirror.example/rt:0.1.0-cpu")
    assert OperatorConfig().runtime_images == RuntimeImages(cpu="mirror.example/rt:0.1.0-cpu")
    monkeypatch.setenv("FLEETSERVE_RUNTIME_IMAGE", "mirror.example/rt:0.1.0")
    assert OperatorConfig().runtime_images == RuntimeImages(
        gpu="mirror.example/rt:0.1.0", cpu="mirror.example/rt:0.1.0-cpu"
    )


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize("value", ["", "r" * 513], ids=["empty", "513-characters"])
def test_an_image_a_pod_cannot_take_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """The spec's bounds: an empty or overlong image is refused at start-up, not at a pod."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=variable.removeprefix("FLEETSERVE_").lower()):
        OperatorConfig()


def test_the_configured_images_reach_the_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconcile the operator runs renders its configured images where a spec names none."""
    monkeypatch.setenv("FLEETSERVE_RUNTIME_IMAGE", "mirror.example/rt:2")
    monkeypatch.setenv("FLEETSERVE_RUNTIME_CPU_IMAGE", "mirror.example/rt:2-cpu")
    spec: dict[str, object] = {"model": MODEL, "fallback": {"enabled": True}}
    assert _images_of_pods(OperatorConfig(), spec) == {
        "demo-stable": "mirror.example/rt:2",
        "demo-fallback": "mirror.example/rt:2-cpu",
    }
    named = {"model": MODEL, "runtime": {"image": "a/rt:1"}, "fallback": {"enabled": True}}
    assert _images_of_pods(OperatorConfig(), named)["demo-stable"] == "a/rt:1"
