"""`make images`' decisions, without podman: which images, with which arguments and bounds.

The builds themselves run in the images e2e tier (e2e/images_e2e), which also runs the images.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from fleetserve_e2e.images.base import BaseRecipe
from fleetserve_e2e.images.build import Built, build_args, default_base, report
from fleetserve_e2e.images.catalog import (
    MB,
    NAMES,
    OPERATOR,
    RUNTIME_CPU,
    RUNTIME_GPU,
    ImagePlanError,
    image_tag,
    plan,
    within_bound,
)
from fleetserve_e2e.images.podman import PODMAN_NOFILE, PODMAN_NPROC, ulimit_options

ROOT = Path(__file__).resolve().parents[2]
SHA = "ab" * 32


def test_all_three_images_are_planned_on_the_given_base() -> None:
    """Operator, GPU runtime, CPU runtime, each with the base, revision and version args."""
    specs = plan(NAMES, base="localhost/base:1", revision="abc", torch_cpu_sha256=SHA)
    assert [spec.name for spec in specs] == [OPERATOR, RUNTIME_GPU, RUNTIME_CPU]
    for spec in specs:
        assert spec.build_args["PYTHON_IMAGE"] == "localhost/base:1"
        assert spec.build_args["REVISION"] == "abc"
        assert spec.dockerfile.is_file()
    operator, gpu, cpu = specs
    assert operator.dockerfile.name == "Dockerfile.operator"
    assert (gpu.build_args["TRACK"], cpu.build_args["TRACK"]) == ("gpu", "cpu")
    assert cpu.build_args["TORCH_CPU_SHA256"] == SHA
    assert "TORCH_CPU_SHA256" not in gpu.build_args


def test_bounds_are_the_operator_250_mb_and_the_cpu_runtime_1_5_gb() -> None:
    """The GPU image is reported, not bounded: NVIDIA's libraries alone are gigabytes."""
    operator, gpu, cpu = plan(NAMES, base="b", revision="r", torch_cpu_sha256=SHA)
    assert (operator.max_bytes, gpu.max_bytes, cpu.max_bytes) == (250 * MB, None, 1500 * MB)
    assert within_bound(operator, 250 * MB)
    assert not within_bound(operator, 250 * MB + 1)
    assert within_bound(gpu, 10_000 * MB)
    assert not within_bound(cpu, 1500 * MB + 1)


@pytest.mark.parametrize("sha", ["", "ab", "AB" * 32, "g" * 64])
def test_the_cpu_track_without_a_wheel_hash_is_refused_by_name(sha: str) -> None:
    """No lock can hold the CPU wheel's hash, so the build refuses to go without one."""
    with pytest.raises(ImagePlanError, match="TORCH_CPU_SHA256"):
        plan((RUNTIME_CPU,), base="b", revision="r", torch_cpu_sha256=sha)
    assert plan((OPERATOR, RUNTIME_GPU), base="b", revision="r", torch_cpu_sha256=sha)


def test_an_unknown_image_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ImagePlanError, match="unknown image 'runtime'.*operator, runtime-gpu"):
        plan(("runtime",), base="b", revision="r")


def test_tags_share_the_version_and_the_cpu_track_is_the_runtime_cpu_tag() -> None:
    assert image_tag(OPERATOR).endswith("/fleetserve-operator:0.1.0")
    assert image_tag(RUNTIME_GPU).endswith("/fleetserve-runtime:0.1.0")
    assert image_tag(RUNTIME_CPU) == image_tag(RUNTIME_GPU) + "-cpu"


def test_build_args_pass_the_ca_bundle_as_a_secret_and_every_build_arg() -> None:
    (spec,) = plan((OPERATOR,), base="localhost/b:1", revision="r")
    args = build_args(spec, Path("/etc/ca.pem"))
    assert args[0] == "build"
    assert args[args.index("--runtime") + 1] == "runc"
    assert args[args.index("--secret") + 1] == "id=ca-bundle,src=/etc/ca.pem"
    assert args[args.index("PYTHON_IMAGE=localhost/b:1") - 1] == "--build-arg"
    assert args[args.index("-t") + 1] == spec.tag
    assert args[-1] == str(ROOT)
    assert "--secret" not in build_args(spec, None)


def test_the_revision_label_is_given_to_every_build() -> None:
    """A cached LABEL step would keep the old revision in podman's cache; --label is fresh."""
    (spec,) = plan((OPERATOR,), base="b", revision="0123abc")
    args = build_args(spec, None)
    assert args[args.index("org.opencontainers.image.revision=0123abc") - 1] == "--label"


def test_the_ca_secret_id_is_the_one_the_dockerfiles_mount() -> None:
    """The id `build_args` passes is the one every pip-installing RUN mounts.

    Otherwise pip inside the build distrusts a TLS-inspecting proxy that the host trusts.
    """
    for dockerfile in ("Dockerfile.operator", "Dockerfile.runtime"):
        text = (ROOT / dockerfile).read_text()
        assert "--mount=type=secret,id=ca-bundle,required=false" in text
        assert "PIP_CERT=/run/secrets/ca-bundle" in text


def test_default_base_is_the_dockerfiles_own_fully_qualified() -> None:
    base = default_base()
    assert base.startswith("docker.io/library/python:3.11")
    assert "@sha256:" in base
    assert base.removeprefix("docker.io/library/") in (ROOT / "Dockerfile.runtime").read_text()


@pytest.mark.parametrize(
    ("nofile", "nproc", "expected"),
    [
        pytest.param(20000, 96363, (20000, PODMAN_NPROC), id="sandboxed"),
        pytest.param(1 << 21, 1 << 20, (PODMAN_NOFILE, PODMAN_NPROC), id="roomy"),
        pytest.param(resource.RLIM_INFINITY, 100, (PODMAN_NOFILE, 100), id="unlimited-files"),
    ],
)
def test_ulimits_are_podmans_defaults_lowered_to_our_hard_limits(
    nofile: int, nproc: int, expected: tuple[int, int]
) -> None:
    options = ulimit_options(nofile, nproc)
    assert options == [
        "--ulimit", f"nofile={expected[0]}:{expected[0]}",
        "--ulimit", f"nproc={expected[1]}:{expected[1]}",
    ]  # fmt: skip


def test_base_tag_changes_with_the_recipe() -> None:
    recipe = BaseRecipe()
    assert recipe.tag() == BaseRecipe().tag()
    assert recipe.tag().startswith("localhost/fleetserve-base:bookworm-py311-")
    assert BaseRecipe(packages=(*recipe.packages, "curl")).tag() != recipe.tag()
    assert "python3-venv" in recipe.packages, "the Dockerfiles run `python -m venv`"
    assert ("usr/local/bin/python", "/usr/bin/python3.11") in recipe.links


def test_report_flags_an_image_over_its_bound() -> None:
    operator, gpu = plan((OPERATOR, RUNTIME_GPU), base="b", revision="r")
    text = report([Built(operator, 260 * MB, 31.4), Built(gpu, 5_400 * MB, 600.0)])
    header, first, second = text.splitlines()
    assert header.split()[:2] == ["image", "size"]
    assert first.split()[:5] == ["operator", "260", "250", "31", "TOO"]
    assert second.split()[:5] == ["runtime-gpu", "5400", "-", "600", "ok"]
