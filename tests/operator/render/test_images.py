"""Which image each track's pods run: the GPU build on the GPU tracks, the CPU one on the fallback.

The runtime container and the model fetch's init container of a pod run the same image; a
track runs the image its spec names, else the operator's default for its kind of track.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_operator.render import child_key, desired_children
from fleetserve_operator.spec import (
    DEFAULT_CPU_IMAGE,
    DEFAULT_IMAGE,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RuntimeImages,
)
from fleetserve_operator.testing import make_spec
from tests.operator.render.rendered import OWNER

CONFIGURED = RuntimeImages(gpu="registry.example/rt:2", cpu="registry.example/rt:2-cpu")
# A fetched model, so that every pod also has the fetch's init container.
FETCHED = {
    "name": "demo",
    "version": "1",
    "uri": "s3://models/demo/1",
    "digest": "sha256:" + "a" * 64,
    "maxBytes": "1Gi",
}


def _images(
    spec: InferenceServiceSpec, status: InferenceServiceStatus | None = None
) -> dict[str, tuple[str, str]]:
    """{Deployment name: (runtime container's image, fetch container's image)}."""
    found: dict[str, tuple[str, str]] = {}
    for child in desired_children(OWNER, spec, status or InferenceServiceStatus()):
        if child_key(child)[0] != "Deployment":
            continue
        pod = child["spec"]["template"]["spec"]
        (runtime,) = pod["containers"]
        (fetch,) = pod["initContainers"]
        found[child["metadata"]["name"]] = (runtime["image"], fetch["image"])
    return found


def _spec(**sections: Any) -> InferenceServiceSpec:
    return make_spec(model=FETCHED, **{"fallback": {"enabled": True}} | sections)


@pytest.mark.parametrize(
    ("images", "gpu", "cpu"),
    [
        pytest.param(None, DEFAULT_IMAGE, DEFAULT_CPU_IMAGE, id="built-in"),
        pytest.param(RuntimeImages(), DEFAULT_IMAGE, DEFAULT_CPU_IMAGE, id="filled-built-in"),
        pytest.param(CONFIGURED, CONFIGURED.gpu, CONFIGURED.cpu, id="configured"),
    ],
)
def test_unset_images_run_the_default_of_each_kind_of_track(
    images: RuntimeImages | None, gpu: str, cpu: str
) -> None:
    """Unset: stable runs the GPU default, the fallback the CPU one, never the GPU's."""
    spec = _spec() if images is None else _spec().with_images(images)
    assert _images(spec) == {"demo-stable": (gpu, gpu), "demo-fallback": (cpu, cpu)}


@pytest.mark.parametrize("images", [RuntimeImages(), CONFIGURED], ids=["built-in", "configured"])
def test_named_images_win_over_the_defaults(images: RuntimeImages) -> None:
    """runtime.image on the GPU tracks, fallback.image on the fallback, whatever the default."""
    spec = _spec(
        runtime={"image": "mine/rt:7"}, fallback={"enabled": True, "image": "mine/rt:7-cpu"}
    ).with_images(images)
    assert _images(spec) == {
        "demo-stable": ("mine/rt:7", "mine/rt:7"),
        "demo-fallback": ("mine/rt:7-cpu", "mine/rt:7-cpu"),
    }


def test_the_fallback_keeps_its_default_when_only_the_gpu_image_is_named() -> None:
    """A named runtime.image is the GPU tracks' alone: the fallback still runs a CPU build."""
    spec = _spec(runtime={"image": "mine/rt:7"}).with_images(CONFIGURED)
    assert _images(spec)["demo-fallback"] == (CONFIGURED.cpu, CONFIGURED.cpu)


def test_mid_rollout_the_canary_runs_the_new_default_and_stable_its_own() -> None:
    """A new default reaches the canary; stable and the fallback's model stay on stableSpec."""
    before = _spec().with_images(RuntimeImages())
    status = InferenceServiceStatus.model_validate(
        {
            "phase": "Progressing",
            "canaryVersion": "1",
            "rollout": {"stableSpec": before.gpu_track.model_dump(by_alias=True)},
        }
    )
    images = _images(_spec().with_images(CONFIGURED), status)
    assert images == {
        "demo-stable": (DEFAULT_IMAGE, DEFAULT_IMAGE),
        "demo-canary": (CONFIGURED.gpu, CONFIGURED.gpu),
        "demo-fallback": (CONFIGURED.cpu, CONFIGURED.cpu),
    }
