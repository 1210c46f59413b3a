"""The runtime images in the spec: unset unless named, bounded, and filled from the operator's."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator.spec import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE, RuntimeImages
from fleetserve_operator.testing import make_spec

CONFIGURED = RuntimeImages(gpu="registry.example/rt:2", cpu="registry.example/rt:2-cpu")
# The digest every operator before configurable images gave `make_spec()`'s GPU track: the
# `status.rollout.stableHash` of a service that ran it, and its pods' spec-hash label.
DIGEST_BEFORE = "806c31dde2db0565"


def test_built_in_images_are_one_release_in_two_tracks() -> None:
    """The CPU track's built-in image is the GPU one's tag with `-cpu`, as the images ship."""
    assert DEFAULT_IMAGE == "ghcr.io/fleetserve/fleetserve-runtime:0.1.0"
    assert DEFAULT_CPU_IMAGE == "ghcr.io/fleetserve/fleetserve-runtime:0.1.0-cpu"
    assert RuntimeImages() == RuntimeImages(gpu=DEFAULT_IMAGE, cpu=DEFAULT_CPU_IMAGE)


def test_images_are_unset_unless_named() -> None:
    """Left out, both images stay None, so the operator can tell "unset" from a choice."""
    spec = make_spec(fallback={"enabled": True})
    assert spec.runtime.image is None
    assert spec.fallback.image is None
    named = make_spec(runtime={"image": "a/rt:1"}, fallback={"image": "a/rt:1-cpu"})
    assert (named.runtime.image, named.fallback.image) == ("a/rt:1", "a/rt:1-cpu")


@pytest.mark.parametrize("section", ["runtime", "fallback"])
@pytest.mark.parametrize(
    ("image", "accepted"),
    [
        pytest.param("", False, id="empty"),
        pytest.param("r", True, id="one-character"),
        pytest.param("r" * 512, True, id="512-characters"),
        pytest.param("r" * 513, False, id="513-characters"),
    ],
)
def test_images_take_a_pods_image_bounds(section: str, image: str, accepted: bool) -> None:
    """Both images are 1 to 512 characters; a refusal names the field."""
    sections: dict[str, Any] = {section: {"image": image}}
    if accepted:
        assert getattr(make_spec(**sections), section).image == image
        return
    with pytest.raises(ValidationError) as caught:
        make_spec(**sections)
    assert caught.value.errors()[0]["loc"] == (section, "image")


def test_the_operator_fills_only_the_images_a_spec_leaves_unset() -> None:
    """`with_images`: unset images become the operator's; a named one is kept."""
    filled = make_spec().with_images(CONFIGURED)
    assert (filled.runtime.image, filled.fallback.image) == (CONFIGURED.gpu, CONFIGURED.cpu)
    named = make_spec(runtime={"image": "a/rt:1"}, fallback={"image": "a/rt:1-cpu"})
    kept = named.with_images(CONFIGURED)
    assert (kept.runtime.image, kept.fallback.image) == ("a/rt:1", "a/rt:1-cpu")


def test_a_spec_never_filled_runs_the_built_in_images() -> None:
    """The pods' images of an unfilled spec are the built-in ones, each on its track."""
    spec = make_spec()
    assert spec.gpu_track.pod_image == DEFAULT_IMAGE
    assert spec.fallback.pod_image == DEFAULT_CPU_IMAGE
    filled = spec.with_images(CONFIGURED)
    assert filled.gpu_track.pod_image == CONFIGURED.gpu
    assert filled.fallback.pod_image == CONFIGURED.cpu


def test_a_new_default_image_is_a_new_gpu_track_digest() -> None:
    """The operator's default is hashed like a named image: changing it is a rollout."""
    base = make_spec().with_images(RuntimeImages()).gpu_track.digest
    assert make_spec().with_images(CONFIGURED).gpu_track.digest != base
    named = make_spec(runtime={"image": CONFIGURED.gpu}).gpu_track.digest
    assert make_spec().with_images(CONFIGURED).gpu_track.digest == named


def test_the_built_in_image_keeps_the_digest_of_older_operators() -> None:
    """Filled, named or neither, the built-in image leaves the digest as it was.

    So an operator upgrade starts no rollout; the CPU image is no part of the digest.
    """
    for spec in (
        make_spec(),
        make_spec().with_images(RuntimeImages()),
        make_spec(runtime={"image": DEFAULT_IMAGE}),
        make_spec(fallback={"enabled": True}).with_images(RuntimeImages(cpu="a/b:1")),
    ):
        assert spec.gpu_track.digest == DIGEST_BEFORE
